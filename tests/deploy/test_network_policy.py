"""deploy/k8s/networkpolicy.yaml against the manifests: ingress is denied by default; every container
port admits exactly its intended sources: the gateway's public ports anyone, metrics ports the namespace
and Prometheus's, and every other port only the mesh pods that call it, as read from their settings
(an address or URL naming the port's Service); no policy names a port or pod that does not exist."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.manifests import K8S_DOCS, k8s_argv, k8s_env, mesh_containers, module_of, workloads
from tests.deploy.netpol import ANYWHERE, NAMESPACE, Pod, admission, host_port, pods_of, service_targets

POLICIES = [d for d in K8S_DOCS if d["kind"] == "NetworkPolicy"]
SERVICES = [d for d in K8S_DOCS if d["kind"] == "Service"]
PODS = pods_of(workloads())
PUBLIC = {("gateway", "grpc"), ("gateway", "http")}  # the mesh's one public endpoint
SCRAPERS = {NAMESPACE, "ns/kubernetes.io/metadata.name=monitoring"}  # Prometheus, for METRICS_PORTS
METRICS_PORTS = {"metrics", "gpu-metrics"}  # a service's /metrics, the telemetry agent's GPU families
# Callers that no setting names: the placer hands gateways a worker's pod IP (there is no worker
# Service), and only the gateway calls workers.
UNNAMED_CALLERS = {("worker", "grpc"): {"pod/gateway"}}


def callers() -> dict[tuple[str, int], set[str]]:
    """(workload, containerPort) -> the pods whose containers' settings address it through a Service."""
    targets = service_targets(SERVICES, PODS)
    found: dict[tuple[str, int], set[str]] = {}
    for workload, container in mesh_containers():
        # Every container takes the whole ConfigMap: only its own module's settings say whom it calls.
        own = "HANZO_" + module_of(k8s_argv(container)).removeprefix("services.").upper() + "_"
        for key, value in k8s_env(container).items():
            address = host_port(value) if key.startswith(own) and isinstance(value, str) else None
            for target in targets.get(address, set()) if address else set():
                found.setdefault(target, set()).add(f"pod/{workload['metadata']['name']}")
    return found


def intended() -> dict[tuple[str, str, int], set[str]]:
    """(workload, port name, containerPort) -> the sources that should reach it."""
    called = callers()
    table = {}
    for pod in PODS:
        for name, port in pod.ports.items():
            if (pod.workload, name) in PUBLIC:
                table[(pod.workload, name, port)] = {ANYWHERE}
            elif name in METRICS_PORTS:
                table[(pod.workload, name, port)] = SCRAPERS
            else:
                table[(pod.workload, name, port)] = called.get(
                    (pod.workload, port), set()
                ) | UNNAMED_CALLERS.get((pod.workload, name), set())
    return table


INTENDED = intended()
ADMISSION = admission(POLICIES, PODS)


def test_the_callers_read_from_the_settings_are_the_mesh() -> None:
    """The derivation itself: placer <- gateway and worker pods, redis <- placer and gateway."""
    assert INTENDED[("placer", "grpc", 50051)] == {"pod/gateway", "pod/worker"}
    assert INTENDED[("redis", "redis", 6379)] == {"pod/placer", "pod/gateway"}
    assert INTENDED[("worker", "grpc", 50061)] == {"pod/gateway"}


def test_ingress_is_denied_by_default() -> None:
    deny = [
        p
        for p in POLICIES
        if p["spec"]["podSelector"] == {}
        and "Ingress" in p["spec"]["policyTypes"]
        and not p["spec"].get("ingress")
    ]
    assert deny, "no default-deny ingress policy: pods no policy selects are open to anyone"


def test_policies_select_and_name_only_what_exists() -> None:
    assert ADMISSION.problems == []


@pytest.mark.parametrize(("workload", "name", "port"), sorted(INTENDED), ids=lambda v: str(v))
def test_each_port_admits_exactly_its_intended_sources(workload: str, name: str, port: int) -> None:
    assert ADMISSION.admitted.get((workload, port), set()) == INTENDED[(workload, name, port)]


PRIVATE = sorted(k for k in INTENDED if k[0] in ("worker", "placer", "redis") and k[1] not in METRICS_PORTS)


@pytest.mark.parametrize(("workload", "name", "port"), PRIVATE, ids=lambda v: str(v))
def test_private_ports_admit_only_mesh_pods(workload: str, name: str, port: int) -> None:
    sources = ADMISSION.admitted.get((workload, port), set())
    assert sources and all(s.startswith("pod/") for s in sources), f"{workload}:{name} admits {sources}"


def test_nothing_is_admitted_on_a_port_no_container_declares() -> None:
    declared = {(w, p) for w, _, p in INTENDED}
    assert set(ADMISSION.admitted) <= declared


# ---------------------------------------------------------------- the model catches what it should

PAIR = [
    Pod("placer", {"app": "placer"}, {"grpc": 50051, "metrics": 9101}),
    Pod("gateway", {"app": "gateway"}, {"grpc": 50050}),
]
OPEN = {("placer", 50051): {ANYWHERE}, ("placer", 9101): {ANYWHERE}, ("gateway", 50050): {ANYWHERE}}


def policy(selector: dict[str, Any], *rules: dict[str, Any]) -> dict[str, Any]:
    spec = {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": list(rules)}
    return {"metadata": {"name": "p"}, "spec": spec}


PLACER = {"matchLabels": {"app": "placer"}}
FROM_GATEWAY = {"from": [{"podSelector": {"matchLabels": {"app": "gateway"}}}]}
FROM_TEAM_X = {"from": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}]}
DENY = policy({})


@pytest.mark.parametrize(
    ("policies", "admitted", "problem"),
    [
        ([], OPEN, None),  # no policy: every port open to anywhere
        ([policy({"matchLabels": {"app": "worker"}})], OPEN, "selects no pod"),
        ([DENY], {}, None),
        (
            [DENY, policy(PLACER, {**FROM_GATEWAY, "ports": [{"port": "grpc"}]})],
            {("placer", 50051): {"pod/gateway"}},
            None,
        ),
        # A rule without `from` admits anywhere; without `ports`, on every port.
        ([DENY, policy(PLACER, {})], {("placer", 50051): {ANYWHERE}, ("placer", 9101): {ANYWHERE}}, None),
        (
            [DENY, policy(PLACER, {**FROM_TEAM_X, "ports": [{"port": 9101}]})],
            {("placer", 9101): {"ns/team=x"}},
            None,
        ),
        # A port no container exposes, by name or by number; a peer matching no pod (a mistyped label).
        ([DENY, policy(PLACER, {"ports": [{"port": "grcp"}]})], {}, "port grcp is exposed by none"),
        ([DENY, policy(PLACER, {"ports": [{"port": 50052}]})], {}, "port 50052 is exposed by none"),
        (
            [DENY, policy(PLACER, {"from": [{"podSelector": {"matchLabels": {"app": "gw"}}}]})],
            {},
            "matches no pod",
        ),
        ([DENY, policy(PLACER, {"ports": [{"port": 53, "protocol": "UDP"}]})], {}, "only single TCP ports"),
    ],
)
def test_admission_model(
    policies: list[dict[str, Any]], admitted: dict[tuple[str, int], set[str]], problem: str | None
) -> None:
    result = admission(policies, PAIR)
    assert {k: v for k, v in result.admitted.items() if v} == admitted
    if problem is None:
        assert result.problems == []
    else:
        assert any(problem in p for p in result.problems), result.problems
