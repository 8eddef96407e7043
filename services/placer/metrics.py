"""Prometheus metrics of one placer, in its own registry (two placers can share a process in tests). The
fleet's GPU series are collected from the snapshot at scrape time (gpu_metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.common.workload import WorkloadClass


class PlacerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """registry: where to register (a gateway embedding a replica passes its own); None: a new one."""
        self.registry = registry or CollectorRegistry()
        self.picks = Counter(
            "hanzo_placer_picks",
            "Pick decisions by workload class and outcome",
            ["workload_class", "outcome"],
            registry=self.registry,
        )
        # Children resolved once (picks run per request; labels() is a locked dict lookup each time).
        self.picked = {w: self.picks.labels(w.name, "picked") for w in WorkloadClass}
        self.pick_seconds = Histogram(
            "hanzo_placer_pick_seconds",
            "Time to decide one pick (filters + scorers), in-process",
            buckets=(25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 1e-2),
            registry=self.registry,
        )
        self.heartbeats = Counter(
            "hanzo_placer_heartbeats", "Worker heartbeats received", registry=self.registry
        )
        self.telemetry_samples = Counter(
            "hanzo_placer_telemetry_samples",
            "GPU samples received from telemetry agents",
            registry=self.registry,
        )
        self.nodes = Gauge("hanzo_placer_nodes", "Workers in this placer's snapshot", registry=self.registry)
        self.stale = Gauge(
            "hanzo_placer_snapshot_stale",
            "1 while Redis cannot be read and picks use the last snapshot",
            registry=self.registry,
        )
