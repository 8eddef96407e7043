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

from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from hanzo.inference.v1 import cluster_state_pb2
from services.common.tasks import cancel_and_wait
from services.placer.cluster.state import ClusterState
from services.placer.cluster.store import ClusterStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncSettings:
    resync_interval_s: float = 5.0
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0


class ClusterView(ClusterState):
    """The cluster state kept in sync with Redis."""

    def __init__(
        self, store: ClusterStore, settings: SyncSettings, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(clock)
        self.store = store
        self.settings = settings
        self.stale = True  # until the first successful resync
        self.synced_once = False
        self.last_sync_s: float | None = None
        self.last_heard_s: float | None = None  # the last whole resync or event from Redis
        self.resyncs = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribed = asyncio.Event()
        self._raw: dict[str, tuple[bytes, bytes | None]] = {}  # last resync's bytes per node

    # --- synchronisation with Redis -------------------------------------------------------------------

    async def start(self) -> None:
        """First resync (best effort) and the background loops."""
        await self.resync()
        self._tasks = [
            asyncio.create_task(self._resync_loop(), name="cluster-resync"),
            asyncio.create_task(self._event_loop(), name="cluster-events"),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []

    async def wait_subscribed(self) -> None:
        """Return once the event subscription is live (tests and start-up ordering)."""
        await self._subscribed.wait()

    async def resync(self) -> bool:
        """Reread the whole registry; False (and stale) when Redis could not be read."""
        now = self.clock()
        try:
            async for entries in self.store.read_all(now):
                self._apply_serialized(entries)
        except (RedisError, OSError) as exc:
            _raise_if_cancelled(exc)
            self.mark_stale(exc)
            self.expire()
            return False
        self.expire()
        if self.stale:
            log.info("cluster state in sync with Redis (%d nodes)", len(self.nodes))
        self.stale = False
        self.synced_once = True
        self.last_sync_s = self.last_heard_s = now
        self.resyncs += 1
        return True

    def _apply_serialized(self, entries: dict[str, tuple[bytes, bytes | None]]) -> None:
        for node_id, (raw_node, raw_thermal) in entries.items():
            # Decoding 8,000 entries costs more than comparing bytes: only changed ones are decoded. And
            # a resync writes the snapshot only where it holds something the view lacks: pub/sub has
            # usually delivered it already, and every snapshot write makes the picker rescore a row.
            last_node, last_thermal = self._raw.get(node_id, (None, None))
            self._raw[node_id] = (raw_node, raw_thermal)
            if raw_thermal != last_thermal:
                if raw_thermal is not None:
                    entry = cluster_state_pb2.ThermalEntry.FromString(raw_thermal)
                    if self.thermal.get(node_id) != entry:
                        self.apply_thermal(node_id, entry)
                # Its thermal key outlived its TTL (the telemetry agent went quiet): the last sample
                # must not pass for a fresh one. Without it the node's thermal state scores as unknown.
                elif self.thermal.pop(node_id, None) is not None:
                    self.snapshot.update_thermal(node_id, None, 0.0)
            if raw_node != last_node:
                self.apply_node(cluster_state_pb2.NodeEntry.FromString(raw_node))

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
                _raise_if_cancelled(exc)
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
                # Buffered messages arrive without suspending; yield so a burst never delays picks.
                await asyncio.sleep(0)
        finally:
            await _close_pubsub(pubsub)

    def _apply_event(self, event: cluster_state_pb2.ClusterEvent) -> None:
        self.last_heard_s = self.clock()
        kind = event.WhichOneof("change")
        if kind == "node":
            self.apply_node(event.node)
        elif kind == "thermal":
            self.apply_thermal(event.node_id, event.thermal)

    def mark_stale(self, exc: BaseException) -> None:
        """Note that Redis failed; picks go on from the last snapshot until a resync succeeds."""
        if not self.stale:
            log.warning("Redis unreachable (%s): serving the last snapshot, marked stale", exc)
        self.stale = True

    def _forget(self, node_id: str) -> None:
        super()._forget(node_id)
        self._raw.pop(node_id, None)


_PUBSUB_CLOSE_TIMEOUT_S = 1.0


def _raise_if_cancelled(exc: BaseException) -> None:
    """Cancelled, when this task's cancellation surfaced as a Redis error: redis-py can turn a cancel
    that lands mid-command into a connection error ("Connection closed by server"), and a retry loop
    that took it for an outage would go on forever, hanging the graceful stop that cancelled it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


async def _close_pubsub(pubsub: PubSub) -> None:
    """Close a subscription, bounded: redis-py's aclose() can wait forever for the socket to close
    (redis/redis-py#3941), which would hang a graceful stop; then drop the connection without waiting."""
    try:
        await asyncio.wait_for(pubsub.aclose(), _PUBSUB_CLOSE_TIMEOUT_S)
    except TimeoutError:
        if pubsub.connection is not None:
            await pubsub.connection.disconnect(nowait=True)
