"""NetworkPolicy semantics, as a cluster applies them, over the manifests' pods: which sources may open a
connection to which container port, and what in a policy points at nothing. Pure functions of parsed
YAML, so the tests can also feed them hand-written policies.

A source is a string: "anywhere" (a rule without `from`), "namespace" (`podSelector: {}`: any pod of the
namespace), "pod/<workload>" (the pods of that workload), "ns/<k>=<v>" (pods of namespaces so
labelled), "ip/<cidr>".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

ANYWHERE = "anywhere"
NAMESPACE = "namespace"


@dataclass(frozen=True)
class Pod:
    """A workload's pod template: its labels and every container's ports (name -> containerPort)."""

    workload: str
    labels: dict[str, str]
    ports: dict[str, int]


@dataclass
class Admission:
    """admitted: (workload, containerPort) -> sources. problems: policy parts that select or name
    nothing, or that the model does not cover (it refuses rather than guesses)."""

    admitted: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def pods_of(workloads: Iterable[dict[str, Any]]) -> list[Pod]:
    pods = []
    for w in workloads:
        template = w["spec"]["template"]
        ports = {
            p.get("name", str(p["containerPort"])): p["containerPort"]
            for c in template["spec"]["containers"]
            for p in c.get("ports", [])
        }
        pods.append(Pod(w["metadata"]["name"], template["metadata"]["labels"], ports))
    return pods


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector with matchLabels only (matchExpressions is refused by admission)."""
    return selector.get("matchLabels", {}).items() <= labels.items()


def _sources(peer: dict[str, Any], pods: list[Pod], where: str, problems: list[str]) -> set[str]:
    if set(peer) - {"podSelector", "namespaceSelector", "ipBlock"}:
        problems.append(f"{where}: unknown peer {peer}")
    if "ipBlock" in peer:
        return {f"ip/{peer['ipBlock']['cidr']}"}
    if "namespaceSelector" in peer:
        labels = peer["namespaceSelector"].get("matchLabels", {})
        if peer.get("podSelector") or not labels or "matchExpressions" in peer["namespaceSelector"]:
            problems.append(f"{where}: namespaceSelector needs matchLabels alone: {peer}")
        return {"ns/" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))}
    selector = peer["podSelector"]
    if "matchExpressions" in selector:
        problems.append(f"{where}: matchExpressions is not modelled: {selector}")
    if not selector.get("matchLabels"):
        return {NAMESPACE}
    matched = {f"pod/{p.workload}" for p in pods if selects(selector, p.labels)}
    if not matched:
        problems.append(f"{where}: podSelector {selector} matches no pod")
    return matched


def _port(pod: Pod, entry: dict[str, Any]) -> int | None:
    port = entry["port"]
    if isinstance(port, str):
        return pod.ports.get(port)
    return port if port in pod.ports.values() else None


def admission(policies: list[dict[str, Any]], pods: list[Pod]) -> Admission:
    """Who may connect to each container port. Pods that no Ingress policy selects are open to
    anywhere on every port, as in a cluster."""
    result = Admission()
    isolated: set[str] = set()
    for policy in policies:
        name, spec = policy["metadata"]["name"], policy["spec"]
        if "matchExpressions" in spec["podSelector"]:
            result.problems.append(f"{name}: matchExpressions is not modelled")
        selected = [p for p in pods if selects(spec["podSelector"], p.labels)]
        if not selected:
            result.problems.append(f"{name}: selects no pod")
        if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
            continue
        isolated |= {p.workload for p in selected}
        for i, rule in enumerate(spec.get("ingress") or []):
            where = f"{name}.ingress[{i}]"
            peers = rule.get("from")
            sources = (
                {ANYWHERE}
                if not peers
                else set().union(*(_sources(x, pods, where, result.problems) for x in peers))
            )
            entries = rule.get("ports")
            for entry in entries or []:
                if entry.get("protocol", "TCP") != "TCP" or "endPort" in entry:
                    result.problems.append(f"{where}: only single TCP ports are modelled: {entry}")
                if not any(_port(p, entry) for p in selected):
                    result.problems.append(f"{where}: port {entry['port']} is exposed by none of its pods")
            for pod in selected:
                ports = pod.ports.values() if entries is None else {_port(pod, e) for e in entries} - {None}
                for port in ports:
                    result.admitted.setdefault((pod.workload, port), set()).update(sources)
    for pod in pods:
        if pod.workload not in isolated:
            for port in pod.ports.values():
                result.admitted.setdefault((pod.workload, port), set()).add(ANYWHERE)
    return result


def host_port(value: str) -> tuple[str, int] | None:
    """(host, port) of an address "host:port" or a URL with both; None for anything else."""
    if "://" in value:
        url = urlparse(value)
        return (url.hostname, url.port) if url.hostname and url.port else None
    host, sep, port = value.rpartition(":")
    return (host, int(port)) if sep and host and port.isdigit() else None


def service_targets(
    services: list[dict[str, Any]], pods: list[Pod]
) -> dict[tuple[str, int], set[tuple[str, int]]]:
    """(Service name, port) -> the (workload, containerPort) it forwards to."""
    targets: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for svc in services:
        selected = [p for p in pods if svc["spec"]["selector"].items() <= p.labels.items()]
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod in selected:
                number = pod.ports.get(target) if isinstance(target, str) else target
                if number is not None:
                    targets.setdefault((svc["metadata"]["name"], port["port"]), set()).add(
                        (pod.workload, number)
                    )
    return targets
