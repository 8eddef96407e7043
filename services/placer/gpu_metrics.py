"""The fleet's GPU state as this placer sees it, for Prometheus: read from the cluster snapshot at
scrape time, so there is a series exactly for each live node with an unexpired sample. A node that
leaves, or whose telemetry stops, loses its series at once instead of showing its last value forever
(gauges set per sample would). One series per node (its latest sample, as picks read it), labelled
node_id and source (nvml or simulated); the agents' own /metrics carry every GPU in DCGM's names."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.placer.cluster.snapshot import ClusterSnapshot

# (family, help, snapshot column)
FAMILIES = (
    ("hanzo_gpu_temperature_celsius", "Latest GPU temperature per worker", "temperature_c"),
    ("hanzo_gpu_throttle_reasons", "Latest NVML clock-event reason bits per worker", "clock_event_reasons"),
    ("hanzo_gpu_power_watts", "Latest GPU power draw per worker", "power_w"),
    ("hanzo_gpu_power_limit_watts", "Enforced GPU power limit per worker", "power_limit_w"),
    ("hanzo_gpu_sm_clock_mhz", "Latest SM clock per worker", "sm_clock_mhz"),
    ("hanzo_gpu_utilization_ratio", "Latest GPU busy fraction per worker", "utilization"),
    ("hanzo_gpu_slowdown_temperature_celsius", "Temperature at which the GPU slows down",
     "slowdown_temperature_c"),
    ("hanzo_gpu_temperature_trend_celsius_per_second", "The placer's temperature trend estimate per worker",
     "temperature_trend_c_per_s"),
)  # fmt: skip


class FleetGpuCollector(Collector):
    """Collects FAMILIES from snapshot_of() (the view's current snapshot) when scraped."""

    def __init__(self, snapshot_of: Callable[[], ClusterSnapshot]) -> None:
        self._snapshot_of = snapshot_of

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._snapshot_of()
        # Scrapes run on the HTTP server's thread while the loop writes rows: each value is read once,
        # so a series may lag a sample by one write, never mix two nodes.
        rows = np.flatnonzero(snapshot.column("live") & snapshot.column("has_thermal")).tolist()
        nodes = [snapshot.node_ids[row] for row in rows]
        simulated = snapshot.column("thermal_simulated")
        sources = ["simulated" if simulated[row] else "nvml" for row in rows]
        for name, documentation, column_name in FAMILIES:
            family = GaugeMetricFamily(name, documentation, labels=["node_id", "source"])
            column = snapshot.column(column_name)
            for row, node, source in zip(rows, nodes, sources, strict=True):
                if node is not None:
                    family.add_metric([node, source], float(column[row]))
            yield family
