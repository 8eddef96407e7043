"""Rollouts do not cut streams: every gateway and worker drains within its pod's grace period (after its
preStop pause) and within compose's stop_grace_period; and the gateway never starts without its keys."""

from __future__ import annotations

import re

import pytest

from services.gateway.config import GatewaySettings
from services.worker.server.config import WorkerSettings
from tests.deploy.manifests import compose_env, k8s_env, mesh_containers, mesh_services

DRAINING = {
    "services.gateway": "HANZO_GATEWAY_DRAIN_TIMEOUT_S",
    "services.worker": "HANZO_WORKER_DRAIN_TIMEOUT_S",
}
DEFAULTS = {
    "services.gateway": GatewaySettings.drain_timeout_s,
    "services.worker": WorkerSettings.drain_timeout_s,
}
MARGIN_S = 5  # for the last writes and the exit after the drain


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)s", text)
    assert match, f"a grace period in seconds: {text!r}"
    return float(match.group(1))


def _pre_stop_s(container: dict) -> float:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return float(command[1]) if command[:1] == ["sleep"] else 0.0


@pytest.mark.parametrize("module", sorted(DRAINING))
def test_k8s_pods_drain_within_their_grace_period(module: str) -> None:
    for workload, container in mesh_containers(module):
        env = k8s_env(container)
        drain = float(env.get(DRAINING[module], DEFAULTS[module]))
        grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        pre_stop = _pre_stop_s(container)
        assert pre_stop > 0, f"{module}: no preStop pause to leave the endpoints before SIGTERM"
        assert pre_stop + drain + MARGIN_S <= grace, f"{module}: {pre_stop} + {drain} s in a {grace} s grace"
        assert drain >= grace / 2, f"{module}: drains {drain} s of a {grace} s grace: streams cut early"


@pytest.mark.parametrize("module", sorted(DRAINING))
def test_compose_stop_grace_covers_the_drain(module: str) -> None:
    for name, svc in mesh_services(module).items():
        drain = float(compose_env(svc).get(DRAINING[module], DEFAULTS[module]))
        grace = _seconds(svc.get("stop_grace_period", "10s"))  # compose's default
        assert drain + MARGIN_S <= grace, f"{name}: drains {drain} s, stopped after {grace} s"


def test_gateway_api_keys_secret_is_required() -> None:
    for _, container in mesh_containers("services.gateway"):
        ref = next(e for e in container["env"] if e["name"] == "HANZO_GATEWAY_API_KEYS")
        assert ref["valueFrom"]["secretKeyRef"]["optional"] is False
