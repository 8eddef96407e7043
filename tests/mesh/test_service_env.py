"""The one builder of the services' environments: setting names checked against each service's own
settings, and the variables each service then reads back into the values given."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.gateway.config import GatewaySettings
from services.mesh.service_env import service_env
from services.placer.config import PlacerSettings
from services.telemetry.config import TelemetrySettings
from services.worker.server.config import WorkerSettings


def test_each_service_reads_back_what_was_given(tmp_path: Path) -> None:
    worker = WorkerSettings.from_env(
        service_env(
            "worker", port=0, node_id="w9", models={"a": tmp_path}, max_num_seqs=8, kv_cache_bytes=None
        )
    )
    assert (worker.port, worker.node_id, worker.models, worker.max_num_seqs) == (0, "w9", {"a": tmp_path}, 8)
    assert worker.kv_cache_bytes is None  # None left the variable out: the default
    gateway = GatewaySettings.from_env(service_env("gateway", http_port="off", api_keys="k1", zone="z1"))
    assert (gateway.http_port, gateway.api_keys, gateway.zone) == (None, frozenset({"k1"}), "z1")
    placer = PlacerSettings.from_env(service_env("placer", port=0, heartbeat_interval_s=0.5))
    assert (placer.port, placer.heartbeat_interval_s) == (0, 0.5)
    agent = TelemetrySettings.from_env(service_env("telemetry", node_id="w9", interval_s=0.05))
    assert (agent.node_id, agent.stream.interval_s) == ("w9", 0.05)


@pytest.mark.parametrize(
    ("service", "settings", "message"),
    [
        ("worker", {"nod_id": "x"}, "worker has no setting 'nod_id'"),
        ("gateway", {"internal_token": "t"}, "set HANZO_INTERNAL_TOKEN"),
        ("placer", {"models": "a=/x"}, "placer has no setting 'models'"),
    ],
)
def test_a_wrong_setting_fails_at_the_caller(service: str, settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        service_env(service, **settings)
