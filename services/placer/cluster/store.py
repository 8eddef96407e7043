"""Cluster state in Redis (redis-py asyncio): the writes each heartbeat or sample makes, and the bulk
read a resync makes. Schema in schema.py. Raises redis exceptions; callers decide what stale means."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from hanzo.inference.v1 import cluster_state_pb2
from services.common.tasks import bounded
from services.placer.cluster.schema import Keys


class ClusterStore:
    """Typed reads and writes of the schema. `client` fails fast when Redis is down, so callers notice
    within a couple of seconds; `events_client` has no read timeout, since a quiet channel is normal."""

    def __init__(self, url: str, keys: Keys) -> None:
        self.url = url
        self.keys = keys
        self.client = aioredis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=2.0)
        self.events_client = aioredis.Redis.from_url(url, socket_connect_timeout=0.5, health_check_interval=5)

    async def close(self) -> None:
        await bounded(self.client.aclose(), "closing the Redis client")
        await bounded(self.events_client.aclose(), "closing the Redis event client")

    async def write_node(self, entry: cluster_state_pb2.NodeEntry, ttl_s: float) -> None:
        """Store a heartbeat (whole entry), refresh its TTL and index, and announce it."""
        node_id = entry.report.node_id
        event = cluster_state_pb2.ClusterEvent(node_id=node_id, node=entry)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.node(node_id), entry.SerializeToString(), px=int(ttl_s * 1000))
            pipe.zadd(self.keys.nodes, {node_id: entry.deadline_s})
            pipe.publish(self.keys.events, event.SerializeToString())
            await pipe.execute()

    async def write_thermal(self, node_id: str, entry: cluster_state_pb2.ThermalEntry, ttl_s: float) -> None:
        """Store a node's latest GPU sample and announce it."""
        event = cluster_state_pb2.ClusterEvent(node_id=node_id, thermal=entry)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.thermal(node_id), entry.SerializeToString(), px=int(ttl_s * 1000))
            pipe.publish(self.keys.events, event.SerializeToString())
            await pipe.execute()

    async def read_all(
        self, now_s: float, batch: int = 500
    ) -> AsyncIterator[dict[str, tuple[bytes, bytes | None]]]:
        """Every live node's serialized NodeEntry and ThermalEntry (None if it has sent no sample), in
        batches: between two batches the event loop serves picks, so a resync of thousands of nodes never
        stalls it. Left serialized so callers can skip the entries that did not change."""
        await self.client.zremrangebyscore(self.keys.nodes, "-inf", now_s)
        node_ids = [n.decode() for n in await self.client.zrangebyscore(self.keys.nodes, now_s, "+inf")]
        for start in range(0, len(node_ids), batch):
            ids = node_ids[start : start + batch]
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.mget([self.keys.node(n) for n in ids])
                pipe.mget([self.keys.thermal(n) for n in ids])
                nodes, thermals = await pipe.execute()
            yield {
                node_id: (raw_node, raw_thermal)
                for node_id, raw_node, raw_thermal in zip(ids, nodes, thermals, strict=True)
                if raw_node is not None  # expired between the index read and the fetch
            }

    async def read_placement(self, node_id: str) -> list[str] | None:
        """Models the planner wants on node_id; None when it has no opinion."""
        raw = await self.client.get(self.keys.placement(node_id))
        return None if raw is None else json.loads(raw)

    async def add_demand(self, window: int, counts: dict[str, int], ttl_s: float) -> None:
        """Add request counts per model to a demand window shared by every placer."""
        key = self.keys.demand(window)
        async with self.client.pipeline(transaction=False) as pipe:
            for model, count in counts.items():
                pipe.zincrby(key, count, model)
            pipe.pexpire(key, int(ttl_s * 1000))
            await pipe.execute()

    async def read_demand(self, window: int) -> dict[str, float]:
        """Request counts per model in one demand window."""
        rows = await self.client.zrange(self.keys.demand(window), 0, -1, withscores=True)
        return {model.decode(): score for model, score in rows}

    async def write_placements(self, plan: dict[str, list[str]], ttl_s: float) -> None:
        """Publish the planner's wanted models per node (expire if the planner stops)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for node_id, models in plan.items():
                pipe.set(self.keys.placement(node_id), json.dumps(sorted(models)), px=int(ttl_s * 1000))
            await pipe.execute()

    async def hold_planner_lease(self, owner: str, ttl_s: float) -> bool:
        """Take or renew the planning lease; True while this owner holds it."""
        key = self.keys.planner_lock
        if await self.client.set(key, owner, nx=True, px=int(ttl_s * 1000)):
            return True
        current = await self.client.get(key)
        if current is not None and current.decode() == owner:
            await self.client.pexpire(key, int(ttl_s * 1000))
            return True
        return False
