"""End to end on loopback: a telemetry agent process streams simulated GPU samples to a placer process,
which then has the node's thermal state for its picks and its metrics, and forgets it once the agent is
gone and the sample's TTL has passed."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from hanzo.inference.v1 import common_pb2, placer_pb2
from services.common.redis_server import RedisServer
from services.mesh.process import ChildProcess, start_service
from services.placer.pick.scorers import ScorerConfig
from tests.placer.cluster_helpers import eventually, node_report, placer_stub

NODE = "gpu-node-1"
NEUTRAL = ScorerConfig().no_sample_thermal_score  # the thermal score of a node with no sample
PICK = placer_pb2.PickRequest(model="llama-tiny", workload_class=common_pb2.WORKLOAD_CLASS_REALTIME_CHAT)


def _placer(redis_server: RedisServer, tmp_path: Path, **env: str) -> ChildProcess:
    base = {"HANZO_PLACER_REDIS_URL": redis_server.url, "HANZO_PLACER_PORT": "0"}
    return start_service(
        "placer", "services.placer", {**base, **env}, "PLACER_READY", tmp_path / "placer.log"
    )


def _agent(placer: ChildProcess, tmp_path: Path, source: str) -> ChildProcess:
    env = {
        "HANZO_TELEMETRY_NODE_ID": NODE,
        "HANZO_TELEMETRY_PLACER_ADDRESS": placer.ready["address"],
        "HANZO_TELEMETRY_INTERVAL_S": "0.05",
        "HANZO_TELEMETRY_SOURCE": source,
    }
    return start_service(
        "telemetry", "services.telemetry", env, "TELEMETRY_READY", tmp_path / "telemetry.log"
    )


async def test_simulated_samples_reach_the_placer(redis_server: RedisServer, tmp_path: Path) -> None:
    placer = _placer(redis_server, tmp_path, HANZO_PLACER_METRICS_PORT="0")
    telemetry = None
    try:
        channel, stub = placer_stub(placer.ready["address"])
        async with channel:
            await stub.Heartbeat(node_report(NODE, running=64))
            telemetry = _agent(
                placer, tmp_path, "auto"
            )  # no NVML here: falls back to the labelled simulation
            assert telemetry.ready["source"] == "simulated"
            metrics_url = f"http://127.0.0.1:{placer.ready['metrics_port']}/metrics"

            async def sampled() -> bool:
                await stub.Heartbeat(node_report(NODE, running=64))
                text = urllib.request.urlopen(metrics_url, timeout=2).read().decode()
                return f'hanzo_gpu_temperature_celsius{{node_id="{NODE}",source="simulated"}}' in text

            await eventually(sampled, 20, "the placer exports the node's simulated GPU temperature")
            reply = await stub.Pick(PICK)
            assert reply.node_id == NODE
            assert "thermal_headroom" in reply.candidates[0].scores
        assert "SIMULATED" in telemetry.log_text()
    finally:
        if telemetry is not None:
            assert telemetry.stop() == 0
        assert placer.stop() == 0


async def test_a_dead_agents_gpu_is_scored_unknown_after_its_ttl(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The agent SIGKILLed while its node keeps heartbeating: once the sample's TTL (3 heartbeat
    intervals) has passed, the placer scores the node's thermal headroom as unknown (neutral), never on
    the last temperature it heard."""
    # A sample lives 0.9 s past its last update, and the placer re-reads Redis as often.
    placer = _placer(
        redis_server, tmp_path, HANZO_PLACER_HEARTBEAT_INTERVAL_S="0.3", HANZO_PLACER_RESYNC_INTERVAL_S="0.3"
    )
    telemetry = None
    try:
        channel, stub = placer_stub(placer.ready["address"])
        async with channel:
            telemetry = _agent(placer, tmp_path, "simulated")

            async def thermal_score() -> float:
                await stub.Heartbeat(node_report(NODE, running=64))
                return (await stub.Pick(PICK)).candidates[0].scores["thermal_headroom"]

            async def sampled() -> bool:
                return await thermal_score() != NEUTRAL

            await eventually(sampled, 20, "the placer scores the agent's samples")
            telemetry.kill()

            async def unknown() -> bool:
                return await thermal_score() == NEUTRAL

            await eventually(unknown, 20, "the dead agent's GPU is scored as unknown")
    finally:
        if telemetry is not None:
            telemetry.kill()
        assert placer.stop() == 0
