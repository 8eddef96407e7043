"""The placer's in-memory cluster state: the columnar snapshot picks read, and the protobuf entries
behind it. Fed by heartbeats and GPU samples (from this placer's own RPCs, from Redis through
ClusterView, or from the fleet simulator, which drives it with no Redis at all); synchronous, so one
pick always sees one consistent state."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from hanzo.inference.v1 import cluster_state_pb2, placer_pb2
from services.common.workload import WorkloadClass
from services.placer.cluster.batches import LoadBatch, ThermalBatch
from services.placer.cluster.convert import node_record, thermal_sample
from services.placer.cluster.snapshot import ClusterSnapshot

# Weight of the newest rate in the smoothed temperature trend (an exponential moving average).
_TREND_ALPHA = 0.3


class ClusterState:
    """Snapshot + the protobuf entries behind it; the only writer of the snapshot."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.snapshot = ClusterSnapshot()
        self.nodes: dict[str, cluster_state_pb2.NodeEntry] = {}
        self.thermal: dict[str, cluster_state_pb2.ThermalEntry] = {}
        self._next_expiry_s = float("inf")  # earliest deadline in the snapshot (a lower bound)

    def apply_node(self, entry: cluster_state_pb2.NodeEntry) -> None:
        """Take a node's heartbeat into the snapshot now, unless the one held is as new."""
        node_id = entry.report.node_id
        known = self.nodes.get(node_id)
        if known is not None and known.deadline_s >= entry.deadline_s:
            return  # our own write coming back as an event, or an older copy read from Redis
        self.nodes[node_id] = entry
        report = entry.report
        if known is not None and _same_but_load(known.report, report):
            # Most heartbeats only move the load: at 8,000 workers a beat each per second, decoding the
            # whole report into a NodeRecord and rewriting its every column was most of their cost.
            self.snapshot.update_load(
                node_id, report.load, report.gpu.memory_free_bytes, entry.deadline_s
            )  # fmt: skip
        else:
            self.snapshot.upsert(node_record(entry, self.thermal.get(node_id)))
        self._next_expiry_s = min(self._next_expiry_s, entry.deadline_s)

    def apply_thermal(self, node_id: str, entry: cluster_state_pb2.ThermalEntry) -> None:
        """Take a node's GPU sample into the snapshot (a node not yet known gets it with its heartbeat)."""
        self.thermal[node_id] = entry
        self.snapshot.update_thermal(node_id, thermal_sample(entry.sample), entry.temperature_trend_c_per_s)

    def apply_loads(self, batch: LoadBatch) -> None:
        """Heartbeats of known nodes that moved only their load, all at once: the rows apply_node's fast
        path would write (a node whose held heartbeat is as new is skipped, as there), one vectorised
        write a column. For a feed that builds no protobufs (the fleet simulator): `nodes` keeps each
        node's last heartbeat taken through apply_node."""
        newer = batch.deadline_s > self.snapshot.deadline_s[batch.rows]
        if not newer.all():
            batch = batch.subset(newer)
        self.snapshot.update_loads(batch)
        if batch.rows.size:
            self._next_expiry_s = min(self._next_expiry_s, float(batch.deadline_s.min()))

    def apply_samples(self, batch: ThermalBatch) -> None:
        """GPU samples of known nodes, all at once, each trend smoothed against the row's last sample as
        thermal_entry smooths it (the same arithmetic, so the same values). Like apply_loads, for a
        feed without protobufs: `thermal` keeps the last entries taken through apply_thermal."""
        snapshot, rows = self.snapshot, batch.rows
        held = snapshot.has_thermal[rows]
        dt = batch.timestamp_s - snapshot.thermal_timestamp_s[rows]
        previous = snapshot.temperature_trend_c_per_s[rows]
        with np.errstate(divide="ignore", invalid="ignore"):  # dt <= 0 rows keep their trend below
            rate = (batch.temperature_c - snapshot.temperature_c[rows]) / dt
        smoothed = np.where(dt > 0, previous + _TREND_ALPHA * (rate - previous), previous)
        snapshot.update_thermals(batch, np.where(held, smoothed, 0.0))

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

    def record_pick(
        self, row: int, workload_class: WorkloadClass = WorkloadClass.UNSPECIFIED, latency_tokens: int = 0
    ) -> None:
        """A request of workload_class was just sent to the node at row (a row of the current snapshot),
        with latency_tokens prompt tokens of the latency classes to compute there
        (prefix_cost.latency_tokens_of). Until that node's next heartbeat it counts as waiting there: a
        heartbeat's load is up to an interval old, and every pick in between would otherwise see the
        same least-loaded node and pile onto it."""
        self.snapshot.add_waiting(row, workload_class == WorkloadClass.BATCH, latency_tokens)

    def expire(self) -> None:
        """Drop nodes whose deadline passed (no heartbeat within the TTL). O(1) until the earliest
        deadline passes, then one vectorised scan: it runs on every pick."""
        now = self.clock()
        if now < self._next_expiry_s:
            return
        snapshot = self.snapshot
        live = snapshot.column("live")
        deadlines = snapshot.column("deadline_s")
        for row in np.flatnonzero(live & (deadlines <= now)):
            node_id = snapshot.node_ids[row]
            if node_id is not None:
                self._forget(node_id)
        remaining = deadlines[snapshot.column("live")]
        self._next_expiry_s = float(remaining.min()) if remaining.size else float("inf")

    def _forget(self, node_id: str) -> None:
        self.nodes.pop(node_id, None)
        self.thermal.pop(node_id, None)
        self.snapshot.remove(node_id)


def _same_but_load(held: placer_pb2.NodeReport, new: placer_pb2.NodeReport) -> bool:
    """new differs from held at most in what ClusterSnapshot.update_load writes: the load and free
    memory (every other field of the report that a NodeRecord carries is compared here)."""
    return (
        held.address == new.address
        and held.draining == new.draining
        and held.topology == new.topology
        and held.gpu.name == new.gpu.name
        and held.gpu.memory_total_bytes == new.gpu.memory_total_bytes
        and held.models == new.models
    )
