"""The placer's Redis clients parse replies with hiredis (a declared dependency): redis-py silently falls
back to its own Python parser without it, with which a resync of 8,000 workers took about three times as
long and the placer applied fewer telemetry events a second (README, Placer)."""

from __future__ import annotations

import time

from redis._parsers.hiredis import _AsyncHiredisParser

from hanzo.inference.v1 import cluster_state_pb2
from services.common.redis_server import RedisServer
from services.placer.cluster.schema import Keys
from services.placer.cluster.store import ClusterStore
from tests.placer.cluster_helpers import node_report


async def test_the_store_reads_a_resync_through_hiredis(redis_server: RedisServer) -> None:
    store = ClusterStore(redis_server.url, Keys())
    try:
        now = time.time()
        for name in ("a", "b", "c"):
            entry = cluster_state_pb2.NodeEntry(report=node_report(name), deadline_s=now + 30)
            await store.write_node(entry, 30.0)
        read: dict[str, tuple[bytes, bytes | None]] = {}
        async for batch in store.read_all(now, batch=2):
            read.update(batch)
        assert sorted(read) == ["a", "b", "c"]
        assert cluster_state_pb2.NodeEntry.FromString(read["b"][0]).report.node_id == "b"
        for client in (store.client, store.events_client):
            connection = client.connection_pool.make_connection()
            assert isinstance(connection._parser, _AsyncHiredisParser)
    finally:
        await store.close()
