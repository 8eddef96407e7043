"""The Prometheus configs, rules and Grafana files in deploy/ are valid as their own tools read them,
agree with each other and with what `hanzo-mesh up --prometheus` writes (services/mesh/prometheus.py).
Whether their queries answer against a running mesh: tests/mesh/test_prometheus.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from services.mesh.prometheus import RULES_DIR, job_of, scrape_config
from tests.deploy.manifests import (
    K8S,
    compose_argv,
    compose_env,
    compose_services,
    mesh_services,
    metrics_port,
    module_of,
    workloads,
)
from tests.deploy.observability import (
    DATASOURCE,
    PROMETHEUS_CONFIG,
    RULES,
    dashboard,
    dashboard_expressions,
    metric_families,
    panels,
    recorded_names,
    rules,
)

PODMONITOR = K8S / "monitoring" / "podmonitor.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus) is missing")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_promtool_accepts_the_compose_config_and_the_local_one(tmp_path: Path) -> None:
    local = tmp_path / "prometheus.yml"
    local.write_text(
        json.dumps(scrape_config([("gateway", "127.0.0.1:9100"), ("worker-1", "127.0.0.1:9102")]))
    )
    for config in (PROMETHEUS_CONFIG, local):
        checked = _promtool("check", "config", str(config))
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_local_config_has_the_compose_configs_jobs_and_rules() -> None:
    compose = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    compose_jobs = {job["job_name"] for job in compose["scrape_configs"]}
    services = ["gateway", "placer", "worker-1", "worker-2", "telemetry-1", "telemetry-2", "redis"]
    local = scrape_config([(s, f"127.0.0.1:{9000 + i}") for i, s in enumerate(services)])
    assert {job["job_name"] for job in local["scrape_configs"]} == compose_jobs
    assert job_of("redis") is None  # Redis serves no /metrics of its own
    assert local["rule_files"] == [str(RULES_DIR / "*.yml")] and RULES.parent == RULES_DIR


def test_every_panel_queries_the_provisioned_data_source() -> None:
    uid = yaml.safe_load(DATASOURCE.read_text())["datasources"][0]["uid"]
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels():
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        assert all(t["datasource"]["uid"] == uid for t in panel["targets"]), panel["title"]


def test_every_recorded_series_is_read_and_every_query_reads_a_metric() -> None:
    """Recorded series feed the alerts; each query reads a family of the mesh or a recorded series (the
    families are checked against a live Prometheus's metadata in tests/mesh/test_prometheus.py)."""
    alerts = " ".join(r["expr"] for r in rules() if "alert" in r)
    assert {name for name in recorded_names() if name not in alerts} == set()
    for expression in dashboard_expressions():
        recorded = any(name in expression.promql for name in recorded_names())
        assert metric_families(expression.promql) or recorded, expression
    for rule in rules():
        assert "record" in rule or rule["annotations"]["summary"], rule


def test_a_histograms_series_are_read_as_its_family() -> None:
    assert metric_families("rate(hanzo_worker_iteration_tokens_total_bucket[1m]) / up") == {
        "hanzo_worker_iteration_tokens_total",
        "up",
    }
    assert metric_families("histogram_quantile(0.5, sum by (le) (rate(x[1m])))") == set()


def test_the_compose_config_scrapes_every_mesh_services_metrics_port() -> None:
    """Prometheus in compose reaches each mesh container by its service name on its metrics port, so a
    service added to or renumbered in docker-compose.yml without its scrape target fails here."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    scraped = {
        (job["job_name"], target)
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    expected = set()
    for name, service in mesh_services().items():
        port = metrics_port(module_of(compose_argv(service)), compose_env(service))
        assert port is not None, f"{name} serves no /metrics in compose"
        expected.add((job_of(name), f"{name}:{port}"))
    assert scraped == expected
    prometheus = compose_services()["prometheus"]
    mounted = {v["source"]: v["target"] for v in prometheus["volumes"]}
    assert mounted["./prometheus"] == "/etc/prometheus", (
        "the rules' path in prometheus.yml is /etc/prometheus"
    )


def test_the_pod_monitor_scrapes_named_ports_of_the_pods_into_the_dashboards_jobs() -> None:
    monitor = yaml.safe_load(PODMONITOR.read_text())
    selected = set(monitor["spec"]["selector"]["matchExpressions"][0]["values"])
    ports = {
        name: {p["name"] for c in pod["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        for pod in workloads()
        for name in [pod["metadata"]["name"]]
    }
    assert selected == {n for n, named in ports.items() if "metrics" in named}
    endpoints = {e["port"]: e for e in monitor["spec"]["podMetricsEndpoints"]}
    assert set(endpoints) == set().union(*ports.values()) & {"metrics", "gpu-metrics"}
    compose_jobs = {
        job["job_name"] for job in yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"]
    }
    jobs = {f"hanzo-{n}" for n in selected} | {endpoints["gpu-metrics"]["relabelings"][0]["replacement"]}
    assert jobs == compose_jobs
