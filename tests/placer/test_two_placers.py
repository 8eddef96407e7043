"""Two placer processes against one Redis see one cluster: stateless replicas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hanzo.inference.v1 import common_pb2, placer_pb2
from services.common.redis_server import RedisServer
from services.mesh.process import ChildProcess, start_service
from tests.placer.cluster_helpers import eventually, node_report, placer_stub


@pytest.fixture
def two_placers(redis_server: RedisServer, tmp_path: Path) -> Iterator[tuple[ChildProcess, ChildProcess]]:
    env = {
        "HANZO_PLACER_REDIS_URL": redis_server.url,
        "HANZO_PLACER_PORT": "0",
        "HANZO_PLACER_HEARTBEAT_INTERVAL_S": "5",
    }
    first = start_service("placer-1", "services.placer", env, "PLACER_READY", tmp_path / "placer-1.log")
    second = start_service("placer-2", "services.placer", env, "PLACER_READY", tmp_path / "placer-2.log")
    yield first, second
    assert first.stop() == 0
    assert second.stop() == 0


async def test_replicas_pick_from_the_same_node_set(
    two_placers: tuple[ChildProcess, ChildProcess],
) -> None:
    first, second = two_placers
    channel_a, a = placer_stub(first.ready["address"])
    channel_b, b = placer_stub(second.ready["address"])
    async with channel_a, channel_b:
        # Every worker heartbeats to the first replica only.
        nodes = [f"w{i}" for i in range(6)]
        for i, node in enumerate(nodes):
            await a.Heartbeat(node_report(node, running=i))

        async def same_view() -> bool:
            seen_b = await b.ListNodes(placer_pb2.ListNodesRequest())
            return sorted(n.node_id for n in seen_b.nodes) == nodes

        await eventually(same_view, 10, "the second replica sees every node")
        # Both replicas agree on the least-loaded node for a latency-sensitive request (their first
        # picks: each then counts its own picks as waiting until the next heartbeats, so they diverge).
        chat = placer_pb2.PickRequest(
            model="llama-tiny", workload_class=common_pb2.WORKLOAD_CLASS_REALTIME_CHAT
        )
        assert (await a.Pick(chat)).node_id == (await b.Pick(chat)).node_id == "w0"
        picks = set()
        for stub in (a, b):
            for cls in (common_pb2.WORKLOAD_CLASS_REALTIME_CHAT, common_pb2.WORKLOAD_CLASS_BATCH):
                reply = await stub.Pick(placer_pb2.PickRequest(model="llama-tiny", workload_class=cls))
                assert reply.considered == len(nodes)
                picks.add(reply.node_id)
        assert picks <= set(nodes)
