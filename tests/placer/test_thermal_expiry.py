"""A node whose telemetry agent went quiet: once its thermal key's TTL has passed in Redis, the next
resync drops the sample from the view, so the node's thermal state scores as unknown rather than as
the last (stale) reading. Real Redis."""

from __future__ import annotations

import time

from hanzo.inference.v1 import cluster_state_pb2
from services.common.redis_server import RedisServer
from services.placer.cluster.schema import Keys
from services.placer.cluster.store import ClusterStore
from services.placer.cluster.view import ClusterView, SyncSettings
from tests.placer.cluster_helpers import eventually, gpu_sample, node_report

THERMAL_TTL_S = 0.3


async def test_an_expired_thermal_sample_leaves_the_view(redis_server: RedisServer) -> None:
    store = ClusterStore(redis_server.url, Keys("thermal-ttl"))
    view = ClusterView(store, SyncSettings())
    try:
        entry = cluster_state_pb2.NodeEntry(report=node_report("n1"), deadline_s=time.time() + 60)
        await store.write_node(entry, ttl_s=60)
        await store.write_thermal("n1", view.thermal_entry("n1", gpu_sample(71.0)), THERMAL_TTL_S)
        await view.resync()
        row = view.snapshot.row_of["n1"]
        assert view.snapshot.has_thermal[row] and "n1" in view.thermal

        async def expired() -> bool:
            return not await store.client.exists(store.keys.thermal("n1"))

        await eventually(expired, 10, "Redis expires the thermal key")
        await view.resync()
        assert not view.snapshot.has_thermal[row], "a stale sample still passes for a fresh one"
        assert "n1" not in view.thermal and view.snapshot.live[row]  # the node itself is still there
    finally:
        await store.close()


async def test_a_resync_writes_the_snapshot_only_where_redis_holds_something_new(
    redis_server: RedisServer,
) -> None:
    # Every snapshot write makes the picker rescore that row; a resync rereads the whole registry
    # every few seconds, most of it already applied from pub/sub, and must not rewrite all of it.
    store = ClusterStore(redis_server.url, Keys("resync-writes"))
    view = ClusterView(store, SyncSettings())
    try:
        for node_id in ("n1", "n2", "n3"):
            entry = cluster_state_pb2.NodeEntry(report=node_report(node_id), deadline_s=time.time() + 60)
            await store.write_node(entry, ttl_s=60)
            await store.write_thermal(node_id, view.thermal_entry(node_id, gpu_sample(60.0)), 60)
        await view.resync()
        assert len(view.nodes) == 3
        position = view.snapshot.write_position
        await view.resync()
        assert view.snapshot.write_position == position, "an unchanged registry rewrote the snapshot"

        position = view.snapshot.write_position
        await store.write_thermal("n3", view.thermal_entry("n3", gpu_sample(80.0)), 60)  # nobody listens
        await view.resync()
        assert view.snapshot.written_since(position) == [view.snapshot.row_of["n3"]]
        assert view.snapshot.temperature_c[view.snapshot.row_of["n3"]] == 80.0

        await view.start()  # the pub/sub listener, besides another resync
        await view.wait_subscribed()
        newer = view.thermal_entry("n2", gpu_sample(75.0))
        await store.write_thermal("n2", newer, 60)  # published too: the view takes it from the event

        async def delivered() -> bool:
            return view.thermal.get("n2") == newer

        await eventually(delivered, 10, "the view applies the published sample")
        position = view.snapshot.write_position
        await view.resync()
        assert view.snapshot.write_position == position, "what pub/sub delivered was written again"

    finally:
        await view.stop()
        await store.close()
