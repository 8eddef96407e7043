"""The baseline placer architecture: no in-memory view; every pick reads the whole registry from Redis.

Per pick: ZRANGEBYSCORE of the node index (live deadlines), one pipelined MGET of every node entry and
every thermal entry, protobuf decoding, then the placer's filters and scorers (same formulas, thresholds,
class weights, last-resort demotion, prefix memory and random tie-break) in a plain Python loop. Thermal
entries are decoded only for the nodes that pass the heartbeat-level filters. It is what a stateless
placer replica would do, written reasonably; bench/placer.py checks that it picks the same best total.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import OrderedDict
from collections.abc import Sequence

import redis.asyncio as aioredis

from hanzo.inference.v1 import cluster_state_pb2, placer_pb2
from services.common.workload import WorkloadClass
from services.placer.cluster.schema import Keys
from services.placer.pick import nvml_bits
from services.placer.pick.filters import FilterConfig
from services.placer.pick.framework import DEFAULT_AVOID_DEGRADED, TIE_TOLERANCE
from services.placer.pick.scorers import ScorerConfig
from services.placer.pick.weights import ClassWeights

NEAR_SLOWDOWN_BAND_C = 3.0  # Picker's default near_slowdown_band_c
THERMAL_BITS = nvml_bits.THERMAL_SLOWDOWN
POWER_BITS = nvml_bits.POWER_SLOWDOWN


class NaivePicker:
    """`await pick(request)` -> PickReply, or None when no worker passes every filter."""

    def __init__(
        self, client: aioredis.Redis, keys: Keys, seed: int = 0, prefix_capacity: int = 100_000
    ) -> None:
        self.client = client
        self.keys = keys
        self.weights = ClassWeights.defaults()
        self.filters = FilterConfig()
        self.scoring = ScorerConfig()
        self._rng = random.Random(seed)
        self._prefix_nodes: OrderedDict[int, str] = OrderedDict()
        self._prefix_capacity = prefix_capacity

    async def pick(self, request: placer_pb2.PickRequest) -> placer_pb2.PickReply | None:
        """One decision from a fresh read of Redis (three round trips, two of them pipelined)."""
        now = time.time()
        node_ids = await self.client.zrangebyscore(self.keys.nodes, now, "+inf")
        ids = [n.decode() for n in node_ids]
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.mget([self.keys.node(n) for n in ids])
            pipe.mget([self.keys.thermal(n) for n in ids])
            raw_nodes, raw_thermals = await pipe.execute()
        workload = WorkloadClass(request.workload_class)
        weights = [(n, w) for n, w in self.weights.for_class(workload).items() if w > 0]
        entries = [None if raw is None else cluster_state_pb2.NodeEntry.FromString(raw) for raw in raw_nodes]
        weight_bytes = _model_weight_bytes(entries, request.model)
        if weight_bytes is None:
            return None  # no worker ever reported the model
        prefix_node = self._prefix_node(request.prefix_chain)
        excluded = set(request.exclude_nodes)
        avoid_degraded = workload in DEFAULT_AVOID_DEGRADED
        penalty = sum(w for _, w in weights) + 1.0
        scored: list[tuple[float, int, dict[str, float]]] = []
        for i, entry in enumerate(entries):
            if entry is None or entry.deadline_s <= now:
                continue
            report = entry.report
            if report.draining or report.node_id in excluded:
                continue
            model = next((m for m in report.models if m.name == request.model), None)
            resident = model is not None and model.resident
            host_copy = model is not None and model.host_copy
            fits = report.gpu.memory_free_bytes >= weight_bytes
            kv_full = report.load.kv_usage >= self.filters.kv_full_fraction
            if model is None or not (resident or fits) or kv_full:
                continue  # model_loadable (a node loads only models it lists) and memory
            raw_thermal = raw_thermals[i]
            sample = None if raw_thermal is None else cluster_state_pb2.ThermalEntry.FromString(raw_thermal)
            if sample is not None and self._critical(sample):
                continue
            scores = {
                name: min(
                    1.0,
                    max(0.0, self._score(name, report, sample, resident, host_copy, request, prefix_node)),
                )
                for name, _ in weights
            }
            total = sum(w * scores[name] for name, w in weights)
            if avoid_degraded and sample is not None and self._degraded(sample):
                total -= penalty
            scored.append((total, i, scores))
        if not scored:
            return None
        best = max(total for total, _, _ in scored)
        ties = [s for s in scored if s[0] >= best - TIE_TOLERANCE]
        chosen = ties[self._rng.randrange(len(ties))] if len(ties) > 1 else ties[0]
        chosen_report = entries[chosen[1]].report  # type: ignore[union-attr]
        self._remember(request.prefix_chain, chosen_report.node_id)
        runners_up = request.explain_top or 3
        others = [s for s in heapq.nlargest(runners_up + 1, scored, key=lambda s: s[0]) if s is not chosen]
        return placer_pb2.PickReply(
            node_id=chosen_report.node_id,
            address=chosen_report.address,
            workload_class=request.workload_class,
            considered=len(scored),
            candidates=[
                placer_pb2.ScoredCandidate(
                    node_id=entries[i].report.node_id,  # type: ignore[union-attr]
                    total=total,
                    scores=scores,
                )
                for total, i, scores in [chosen, *others[:runners_up]]
            ],
        )

    def _critical(self, entry: cluster_state_pb2.ThermalEntry) -> bool:
        """filters.not_thermally_critical, negated, for a node with a sample."""
        s = entry.sample
        below_shutdown = s.shutdown_temperature_c <= 0.0 or (
            s.temperature_c < s.shutdown_temperature_c - self.filters.shutdown_margin_c
        )
        slowdown = (
            s.slowdown_temperature_c
            if s.slowdown_temperature_c > 0.0
            else nvml_bits.DEFAULT_SLOWDOWN_TEMPERATURE_C
        )
        hw_throttled = bool(s.clock_event_reasons & nvml_bits.HW_THERMAL)
        return not below_shutdown or (hw_throttled and s.temperature_c >= slowdown)

    def _degraded(self, entry: cluster_state_pb2.ThermalEntry) -> bool:
        """Picker._degraded for a node with a sample."""
        s = entry.sample
        slowdown = (
            s.slowdown_temperature_c
            if s.slowdown_temperature_c > 0.0
            else nvml_bits.DEFAULT_SLOWDOWN_TEMPERATURE_C
        )
        return bool(s.clock_event_reasons & (THERMAL_BITS | POWER_BITS)) or (
            s.temperature_c >= slowdown - NEAR_SLOWDOWN_BAND_C
        )

    def _score(
        self,
        name: str,
        report: placer_pb2.NodeReport,
        thermal: cluster_state_pb2.ThermalEntry | None,
        resident: bool,
        host_copy: bool,
        request: placer_pb2.PickRequest,
        prefix_node: str | None,
    ) -> float:
        """The formulas of services/placer/pick/scorers.py, one node at a time."""
        if name == "model_affinity":
            return 0.5 * (resident or host_copy) + 0.5 * resident
        if name == "load":
            load = report.load
            busy = 0.5 * float(load.running + load.waiting) / max(float(load.max_running), 1.0)
            return 1.0 - min(1.0, max(0.0, busy + 0.5 * load.kv_usage))
        if name == "thermal_headroom":
            if thermal is None:
                return self.scoring.no_sample_thermal_score
            s = thermal.sample
            slowdown = (
                s.slowdown_temperature_c
                if s.slowdown_temperature_c > 0.0
                else self.scoring.default_slowdown_c
            )
            rising = max(thermal.temperature_trend_c_per_s, 0.0)
            headroom = (slowdown - s.temperature_c - rising * self.scoring.thermal_horizon_s) / (
                self.scoring.thermal_span_c
            )
            score = min(1.0, max(0.0, headroom))
            if s.clock_event_reasons & POWER_BITS:
                score *= 0.25
            if s.clock_event_reasons & THERMAL_BITS:
                score = 0.0
            return score
        if name == "topology":
            caller, where = request.caller, report.topology
            if caller.host and caller.host == where.host:
                return 1.0
            if caller.rack and caller.rack == where.rack and caller.zone == where.zone:
                return 0.7  # a rack is qualified by its zone (snapshot.topology_keys)
            return 0.4 if caller.zone and caller.zone == where.zone else 0.0
        if name == "prefix_affinity":
            return 1.0 if prefix_node is not None and prefix_node == report.node_id else 0.0
        raise ValueError(f"unknown scorer {name!r}")

    def _prefix_node(self, chain: Sequence[int]) -> str | None:
        """The node last sent the longest remembered prefix of the prompt."""
        for prefix in reversed(chain):
            node_id = self._prefix_nodes.get(prefix)
            if node_id is not None:
                return node_id
        return None

    def _remember(self, chain: Sequence[int], node_id: str) -> None:
        if self._prefix_capacity == 0:
            return
        for prefix in chain:
            self._prefix_nodes[prefix] = node_id
            self._prefix_nodes.move_to_end(prefix)
        while len(self._prefix_nodes) > self._prefix_capacity:
            self._prefix_nodes.popitem(last=False)


def _model_weight_bytes(entries: list[cluster_state_pb2.NodeEntry | None], model: str) -> int | None:
    """The model's size as any worker reports it (the snapshot keeps the last nonzero one); None if none
    reports the model."""
    found = None
    for entry in entries:
        if entry is None:
            continue
        for m in entry.report.models:
            if m.name == model:
                if m.weight_bytes:
                    return m.weight_bytes
                found = 0
    return found
