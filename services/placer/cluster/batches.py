"""Many nodes' heartbeats or GPU samples at once, as columns: what a feed that holds no protobufs (the
fleet simulator, sim/feed.py) hands ClusterState.apply_loads / apply_samples. Each field is an array
with one entry per row, or one value for every row; the snapshot writes them with one vectorised
assignment a column, where one protobuf a node costs a message build, a comparison and a write a field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

Column = np.ndarray | float | int | bool  # per row, or one value for every row


@dataclass(frozen=True)
class LoadBatch:
    """Heartbeats that moved only the load (ClusterSnapshot.update_load's fields) of the nodes at rows."""

    rows: np.ndarray  # snapshot rows of known nodes, each at most once
    deadline_s: np.ndarray
    running: Column
    waiting: Column
    max_running: Column
    batch_running: Column
    batch_waiting: Column
    latency_prompt_tokens: Column
    kv_usage: Column
    memory_free_bytes: Column

    def subset(self, keep: np.ndarray) -> LoadBatch:
        """The heartbeats where keep (a mask over rows) is true."""
        return replace(
            self,
            **{f.name: v[keep] for f in fields(self) if isinstance(v := getattr(self, f.name), np.ndarray)},
        )


@dataclass(frozen=True)
class ThermalBatch:
    """GPU samples (a ThermalSample's fields) of the nodes at rows; trends are ClusterState's to smooth."""

    rows: np.ndarray  # snapshot rows of known nodes, each at most once
    timestamp_s: np.ndarray
    temperature_c: np.ndarray
    simulated: Column
    slowdown_temperature_c: Column
    shutdown_temperature_c: Column
    clock_event_reasons: Column
    power_w: Column
    power_limit_w: Column
    sm_clock_mhz: Column
    sm_clock_max_mhz: Column
    utilization: Column
