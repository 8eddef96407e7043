"""The dashboard's and the rules' PromQL, read from deploy/, for the tests that check them: with promtool
and the local mesh's config here, and against a real Prometheus scraping a running mesh
(tests/mesh/test_prometheus.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.manifests import DEPLOY

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "hanzo-mesh.json"
DATASOURCE = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "rules" / "hanzo.rules.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
# Grafana's $__rate_interval is at least four scrape intervals; the local mesh scrapes every second.
RATE_INTERVAL = "15s"
# Series a family of each type serves (prometheus_client appends _total to counters in the exposition).
_SERIES_SUFFIXES = ("_bucket", "_count", "_sum")
_METRIC = re.compile(r"\b(hanzo_[a-z0-9_]+|grpc_server_[a-z_]+|DCGM_FI_[A-Z_]+|up)\b(?!\s*\()")


@dataclass(frozen=True)
class Expression:
    where: str  # "panel <title> <refId>" or "rule <name>"
    promql: str


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_expressions() -> list[Expression]:
    """Every panel target's query, with Grafana's $__rate_interval as the local mesh would have it."""
    return [
        Expression(f"panel {p['title']!r} {t['refId']}", t["expr"].replace("$__rate_interval", RATE_INTERVAL))
        for p in panels()
        for t in p["targets"]
    ]


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def rule_expressions() -> list[Expression]:
    return [Expression(f"rule {r.get('record') or r['alert']}", r["expr"]) for r in rules()]


def recorded_names() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def metric_families(promql: str) -> set[str]:
    """The metric families an expression reads (a histogram's _bucket/_count/_sum read its family)."""
    names = set()
    for name in _METRIC.findall(promql):
        for suffix in _SERIES_SUFFIXES:
            if name.endswith(suffix):
                name = name.removesuffix(suffix)
                break
        names.add(name)
    return names


VLLM_QUERIES_FILE = Path(__file__).with_name("vllm_dashboard_queries.txt")


def vllm_dashboard_queries() -> list[str]:
    """vLLM's own dashboard queries (the file says where they come from)."""
    lines = VLLM_QUERIES_FILE.read_text().splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


_MAPPED_ROW = re.compile(r"^\| `(hanzo_worker_[a-z0-9_]+)` \|.*\(`vllm:([a-z0-9_]+)`\)", re.M)
_VLLM_NAME = re.compile(r"vllm:([a-z0-9_]+)")


def vllm_names() -> dict[str, str]:
    """vLLM's family -> the mesh's, from deploy/SERVICES.md's worker metrics table."""
    text = (DEPLOY / "SERVICES.md").read_text()
    return {vllm: ours for ours, vllm in _MAPPED_ROW.findall(text)}


def from_vllm(query: str, model: str) -> str:
    """A vLLM dashboard query for the mesh: each vllm: family by the documented mapping (a histogram's
    series suffix kept), $model_name and $__rate_interval filled in. KeyError: a family not mapped."""
    names = vllm_names()

    def swap(match: re.Match[str]) -> str:
        name = match.group(1)
        for suffix in ("", *_SERIES_SUFFIXES):
            if suffix == "" or name.endswith(suffix):
                family = name.removesuffix(suffix) if suffix else name
                if family in names:
                    return names[family] + suffix
        raise KeyError(f"vllm:{name} is not in deploy/SERVICES.md's mapping")

    return (
        _VLLM_NAME.sub(swap, query).replace("$model_name", model).replace("$__rate_interval", RATE_INTERVAL)
    )
