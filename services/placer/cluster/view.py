"""The placer's in-memory view of the cluster, kept fresh from Redis.

Pub/sub events are hints applied as they arrive; a periodic resync rereads everything and repairs what
was missed. When Redis is unreachable the view keeps serving its last state, flagged stale, and
reconnects with backoff. A node vanishes from the view when its deadline passes, not when Redis stops
listing it: after a flush an empty registry means "unknown", not "no nodes".
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from hanzo.inference.v1 import cluster_state_pb2
from services.placer.cluster.convert import node_record
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.cluster.store import ClusterStore

log = logging.getLogger(__name__)

# Weight of the newest rate in the smoothed temperature trend (an exponential moving average).
_TREND_ALPHA = 0.3


@dataclass(frozen=True)
class SyncSettings:
    resync_interval_s: float = 1.0
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0


class ClusterView:
    """Snapshot + the protobuf entries behind it; the only writer of the snapshot."""

    def __init__(
        self, store: ClusterStore, settings: SyncSettings, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.snapshot = ClusterSnapshot()
        self.nodes: dict[str, cluster_state_pb2.NodeEntry] = {}
        self.thermal: dict[str, cluster_state_pb2.ThermalEntry] = {}
        self.stale = True  # until the first successful resync
        self.synced_once = False
        self.last_sync_s: float | None = None
        self.resyncs = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribed = asyncio.Event()

    # --- local updates (the heartbeat / telemetry this placer received itself) -----------------------

    def apply_node(self, entry: cluster_state_pb2.NodeEntry) -> None:
        """Take a node's heartbeat into the snapshot now."""
        node_id = entry.report.node_id
        self.nodes[node_id] = entry
        self.snapshot.upsert(node_record(entry, self.thermal.get(node_id)))

    def apply_thermal(self, node_id: str, entry: cluster_state_pb2.ThermalEntry) -> None:
        """Take a node's GPU sample into the snapshot (only once its heartbeat is known)."""
        self.thermal[node_id] = entry
        node = self.nodes.get(node_id)
        if node is not None:
            self.snapshot.upsert(node_record(node, entry))

    def thermal_entry(self, node_id: str, sample: object) -> cluster_state_pb2.ThermalEntry:
        """A ThermalEntry for a new sample, with the trend smoothed against the previous one."""
        entry = cluster_state_pb2.ThermalEntry(sample=sample)  # type: ignore[arg-type]
        previous = self.thermal.get(node_id)
        if previous is not None:
            dt = entry.sample.timestamp_s - previous.sample.timestamp_s
            if dt > 0:
                rate = (entry.sample.temperature_c - previous.sample.temperature_c) / dt
                trend = previous.temperature_trend_c_per_s
                entry.temperature_trend_c_per_s = trend + _TREND_ALPHA * (rate - trend)
            else:
                entry.temperature_trend_c_per_s = previous.temperature_trend_c_per_s
        return entry

    def expire(self) -> None:
        """Drop nodes whose deadline passed (no heartbeat within the TTL)."""
        now = self.clock()
        for node_id in [n for n, e in self.nodes.items() if e.deadline_s <= now]:
            self._forget(node_id)

    # --- synchronisation with Redis -------------------------------------------------------------------

    async def start(self) -> None:
        """First resync (best effort) and the background loops."""
        await self.resync()
        self._tasks = [
            asyncio.create_task(self._resync_loop(), name="cluster-resync"),
            asyncio.create_task(self._event_loop(), name="cluster-events"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def wait_subscribed(self) -> None:
        """Return once the event subscription is live (tests and start-up ordering)."""
        await self._subscribed.wait()

    async def resync(self) -> bool:
        """Reread the whole registry; False (and stale) when Redis could not be read."""
        now = self.clock()
        try:
            entries = await self.store.read_all(now)
        except (RedisError, OSError) as exc:
            self.mark_stale(exc)
            self.expire()
            return False
        for node_id, (entry, thermal) in entries.items():
            if thermal is not None:
                self.thermal[node_id] = thermal
            known = self.nodes.get(node_id)
            # A newer local heartbeat wins over what Redis held when it was read.
            if known is None or known.deadline_s <= entry.deadline_s:
                self.apply_node(entry)
        self.expire()
        if self.stale:
            log.info("cluster state in sync with Redis (%d nodes)", len(self.nodes))
        self.stale = False
        self.synced_once = True
        self.last_sync_s = now
        self.resyncs += 1
        return True

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_interval_s)
            await self.resync()

    async def _event_loop(self) -> None:
        """Subscribe and apply events; on any Redis error resubscribe with exponential backoff."""
        delay = self.settings.backoff_initial_s
        while True:
            try:
                await self._listen()
            except (RedisError, OSError) as exc:
                self._subscribed.clear()
                self.mark_stale(exc)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, self.settings.backoff_max_s)
                if await self.resync():
                    delay = self.settings.backoff_initial_s

    async def _listen(self) -> None:
        pubsub = self.store.events_client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.store.keys.events)
            self._subscribed.set()
            async for message in pubsub.listen():
                if message["type"] == "message":
                    self._apply_event(cluster_state_pb2.ClusterEvent.FromString(message["data"]))
        finally:
            await pubsub.aclose()

    def _apply_event(self, event: cluster_state_pb2.ClusterEvent) -> None:
        kind = event.WhichOneof("change")
        if kind == "node":
            known = self.nodes.get(event.node_id)
            if known is None or known.deadline_s <= event.node.deadline_s:
                self.apply_node(event.node)
        elif kind == "thermal":
            self.apply_thermal(event.node_id, event.thermal)

    def mark_stale(self, exc: BaseException) -> None:
        """Note that Redis failed; picks go on from the last snapshot until a resync succeeds."""
        if not self.stale:
            log.warning("Redis unreachable (%s): serving the last snapshot, marked stale", exc)
        self.stale = True

    def _forget(self, node_id: str) -> None:
        self.nodes.pop(node_id, None)
        self.thermal.pop(node_id, None)
        self.snapshot.remove(node_id)
