"""Pick filters: each `(snapshot, query) -> bool[num_rows]`, True where the node may take the request.

Filters are pure: they read the snapshot's columns and never change them. The framework ANDs every
registered filter; a node has to pass all of them to be scored at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick import nvml_bits
from services.placer.pick.query import PickQuery

Filter = Callable[[ClusterSnapshot, PickQuery], np.ndarray]


@dataclass(frozen=True)
class FilterConfig:
    kv_full_fraction: float = 0.98  # kv_usage at or above this means the node cannot hold another sequence
    shutdown_margin_c: float = 5.0  # refuse a GPU this close (degrees C) to its shutdown temperature


def healthy(snapshot: ClusterSnapshot, query: PickQuery) -> np.ndarray:
    """live and deadline_s > query.now_s (heartbeat not expired) and not draining and not in query.exclude."""
    ok = (
        snapshot.column("live") & (snapshot.column("deadline_s") > query.now_s) & ~snapshot.column("draining")
    )
    for node_id in query.exclude:
        row = snapshot.row_of.get(node_id)
        if row is not None:
            ok[row] = False
    return ok


def model_loadable(snapshot: ClusterSnapshot, query: PickQuery) -> np.ndarray:
    """resident or host_copy or memory_free_bytes >= weight_bytes; all False if no node ever reported
    the model. A weight_bytes of 0 (size never reported) lets any node count as able to load it.
    """
    model = snapshot.model_columns(query.model)
    if model is None:
        return np.zeros(snapshot.num_rows, dtype=bool)
    fits = snapshot.column("memory_free_bytes") >= model.weight_bytes
    return model.resident | model.host_copy | fits


def memory(snapshot: ClusterSnapshot, query: PickQuery, *, kv_full_fraction: float = 0.98) -> np.ndarray:
    """kv_usage < kv_full_fraction, and where the model is not resident memory_free_bytes >= weight_bytes.

    A host copy still has to be copied onto the GPU, so it needs the free memory as much as a cold load.
    """
    ok = snapshot.column("kv_usage") < kv_full_fraction
    model = snapshot.model_columns(query.model)
    if model is None:
        return ok  # model_loadable rejects every node anyway
    fits = snapshot.column("memory_free_bytes") >= model.weight_bytes
    return ok & (model.resident | fits)


def not_thermally_critical(
    snapshot: ClusterSnapshot, query: PickQuery, *, shutdown_margin_c: float = 5.0
) -> np.ndarray:
    """Nodes without a thermal sample pass. With one, both must hold:
    - temperature_c < shutdown_temperature_c - shutdown_margin_c (only where shutdown is known, i.e. > 0);
    - not (a hardware thermal slowdown bit is set and temperature_c >= the slowdown threshold, which is
      nvml_bits.DEFAULT_SLOWDOWN_TEMPERATURE_C where unknown).
    Milder heat (software slowdown, near the threshold) is left to scoring: such a GPU is a last resort for
    latency classes, not removed.
    """
    temp = snapshot.column("temperature_c")
    shutdown = snapshot.column("shutdown_temperature_c")
    below_shutdown = (shutdown <= 0.0) | (temp < shutdown - shutdown_margin_c)
    hw_throttled = nvml_bits.any_bits(snapshot.column("clock_event_reasons"), nvml_bits.HW_THERMAL)
    past_slowdown = temp >= nvml_bits.slowdown_threshold_c(snapshot.column("slowdown_temperature_c"))
    critical = ~below_shutdown | (hw_throttled & past_slowdown)
    return ~(snapshot.column("has_thermal") & critical)


def build_filters(config: FilterConfig | None = None) -> dict[str, Filter]:
    """The standard filters by name, with config's thresholds bound in."""
    config = config or FilterConfig()
    return {
        "healthy": healthy,
        "model_loadable": model_loadable,
        "memory": functools.partial(memory, kv_full_fraction=config.kv_full_fraction),
        "not_thermally_critical": functools.partial(
            not_thermally_critical, shutdown_margin_c=config.shutdown_margin_c
        ),
    }


DEFAULT_FILTERS: Mapping[str, Filter] = MappingProxyType(build_filters())  # read-only
