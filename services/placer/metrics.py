"""Prometheus metrics of one placer replica, in its own registry (two placers can share a process in
tests; a gateway embedding a replica passes its own). The fleet's GPU series are collected from the
snapshot at scrape time (gpu_metrics.py); the view's freshness is read from the view at scrape time too,
so every replica reports it, embedded or not."""

from __future__ import annotations

import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.common.workload import WorkloadClass
from services.placer.cluster.view import ClusterView
from services.placer.pick.framework import PickResult

PREFIX_COST = "prefix_cost"  # the decisions' scorer label for a pick the prefix cost rule decided


class PlacerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """registry: where to register; None: a new one."""
        self.registry = registry or CollectorRegistry()
        self.picks = Counter(
            "hanzo_placer_picks",
            "Pick decisions by workload class and outcome: picked, last_resort (only degraded GPUs were "
            "left: throttled or near slowdown), none (no worker could take it)",
            ["workload_class", "outcome"],
            registry=self.registry,
        )
        # Children resolved once (picks run per request; labels() is a locked dict lookup each time).
        self.picked = {w: self.picks.labels(w.name, "picked") for w in WorkloadClass}
        self.last_resort = {w: self.picks.labels(w.name, "last_resort") for w in WorkloadClass}
        self.decisions = Counter(
            "hanzo_placer_decisions",
            "Picks by workload class and winning scorer: the one that added most to the chosen node's "
            "weighted total, or prefix_cost where the prefix cost rule kept the node holding the "
            "prompt's prefix over the ranked winner",
            ["workload_class", "scorer"],
            registry=self.registry,
        )
        self._decided: dict[tuple[WorkloadClass, str], Counter] = {}
        pick_seconds = Histogram(
            "hanzo_placer_pick_seconds",
            "Time to decide one pick (filters + scorers), in-process, by workload class",
            ["workload_class"],
            buckets=(25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 1e-2),
            registry=self.registry,
        )
        self.pick_seconds = {w: pick_seconds.labels(w.name) for w in WorkloadClass}
        self.heartbeats = Counter(
            "hanzo_placer_heartbeats", "Worker heartbeats received", registry=self.registry
        )
        self.telemetry_samples = Counter(
            "hanzo_placer_telemetry_samples",
            "GPU samples received from telemetry agents",
            registry=self.registry,
        )
        self.nodes = Gauge("hanzo_placer_nodes", "Workers in this replica's view", registry=self.registry)
        self.stale = Gauge(
            "hanzo_placer_snapshot_stale",
            "1 while Redis cannot be read and picks use the last snapshot",
            registry=self.registry,
        )
        self.view_age = Gauge(
            "hanzo_placer_view_age_seconds",
            "Seconds since the view last heard from Redis (an event or a whole resync); it grows while "
            "Redis is unreachable, and stays within the resync interval while it is not",
            registry=self.registry,
        )

    def watch(self, view: ClusterView) -> None:
        """Read the view's node count, stale flag and age whenever the metrics are scraped."""
        self.nodes.set_function(lambda: len(view.nodes))
        self.stale.set_function(lambda: 1.0 if view.stale else 0.0)
        started = time.time()
        self.view_age.set_function(lambda: time.time() - (view.last_heard_s or started))

    def decided(self, workload: WorkloadClass, weights: Mapping[str, float], result: PickResult) -> None:
        """Count one pick by its outcome and winning scorer; weights: the class's scorer weights."""
        (self.last_resort if result.last_resort else self.picked)[workload].inc()
        scores = result.candidates[0].scores
        if not scores:
            return
        if result.prefix_kept:
            winner = PREFIX_COST
        else:
            winner = max(scores, key=lambda name: scores[name] * weights.get(name, 0.0))
        child = self._decided.get((workload, winner))
        if child is None:
            child = self._decided[workload, winner] = self.decisions.labels(workload.name, winner)
        child.inc()
