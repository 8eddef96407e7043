"""Pick filters: each `(snapshot, query, rows) -> bool[len(rows)]`, True where the node may take the request.

`rows` is a slice over the whole snapshot or an array of row indices: the Picker keeps every row's
verdict per model and class and asks again only for the rows written since (snapshot.written_since), so
a filter may read from the query only the model, the workload class and now_s (compared against
deadline_s: a verdict that time changes is caught by the deadline alone). Per-request conditions, such as
the nodes a retry excludes, are the Picker's. Filters are pure: they read columns and change nothing. A
node has to pass every registered filter to be scored at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick import nvml_bits
from services.placer.pick.query import PickQuery

Rows = slice | np.ndarray  # the rows asked about: a slice of the snapshot or row indices
Filter = Callable[[ClusterSnapshot, PickQuery, Rows], np.ndarray]


@dataclass(frozen=True)
class FilterConfig:
    kv_full_fraction: float = 0.98  # kv_usage at or above this means the node cannot hold another sequence
    shutdown_margin_c: float = 5.0  # refuse a GPU this close (degrees C) to its shutdown temperature


def all_rows(snapshot: ClusterSnapshot) -> slice:
    """Every row of snapshot, as the rows argument of a filter or a row scorer."""
    return slice(0, snapshot.num_rows)


def healthy(snapshot: ClusterSnapshot, query: PickQuery, rows: Rows) -> np.ndarray:
    """deadline_s > query.now_s (heartbeat not expired) and not draining. (Rows of nodes that left are
    never candidates: the Picker and passing() require live on top of every filter.)"""
    return (snapshot.deadline_s[rows] > query.now_s) & ~snapshot.draining[rows]


def model_loadable(snapshot: ClusterSnapshot, query: PickQuery, rows: Rows) -> np.ndarray:
    """resident or host_copy, or listed (in the node's catalog) and memory_free_bytes >= weight_bytes;
    all False if no node ever reported the model. A weight_bytes of 0 (size never reported) lets any
    node that lists the model count as able to load it. A node that does not list it cannot load it,
    however much memory it has free: a worker loads only its own catalog.
    """
    model = snapshot.models.get(query.model)
    if model is None:
        return np.zeros(snapshot.live[rows].shape, dtype=bool)
    fits = snapshot.memory_free_bytes[rows] >= model.weight_bytes
    return model.resident[rows] | model.host_copy[rows] | (model.listed[rows] & fits)


def memory(
    snapshot: ClusterSnapshot, query: PickQuery, rows: Rows, *, kv_full_fraction: float = 0.98
) -> np.ndarray:
    """kv_usage < kv_full_fraction, and where the model is not resident memory_free_bytes >= weight_bytes.

    A host copy still has to be copied onto the GPU, so it needs the free memory as much as a cold load.
    """
    ok = snapshot.kv_usage[rows] < kv_full_fraction
    model = snapshot.models.get(query.model)
    if model is None:
        return ok  # model_loadable rejects every node anyway
    fits = snapshot.memory_free_bytes[rows] >= model.weight_bytes
    return ok & (model.resident[rows] | fits)


def not_thermally_critical(
    snapshot: ClusterSnapshot, query: PickQuery, rows: Rows, *, shutdown_margin_c: float = 5.0
) -> np.ndarray:
    """Nodes without a thermal sample pass. With one, both must hold:
    - temperature_c < shutdown_temperature_c - shutdown_margin_c (only where shutdown is known, i.e. > 0);
    - not (a hardware thermal slowdown bit is set and temperature_c >= the slowdown threshold, which is
      nvml_bits.DEFAULT_SLOWDOWN_TEMPERATURE_C where unknown).
    Milder heat (software slowdown, near the threshold) is left to scoring: such a GPU is a last resort for
    latency classes, not removed.
    """
    temp = snapshot.temperature_c[rows]
    shutdown = snapshot.shutdown_temperature_c[rows]
    below_shutdown = (shutdown <= 0.0) | (temp < shutdown - shutdown_margin_c)
    hw_throttled = nvml_bits.any_bits(snapshot.clock_event_reasons[rows], nvml_bits.HW_THERMAL)
    past_slowdown = temp >= nvml_bits.slowdown_threshold_c(snapshot.slowdown_temperature_c[rows])
    critical = ~below_shutdown | (hw_throttled & past_slowdown)
    return ~(snapshot.has_thermal[rows] & critical)


def verdict(snapshot: ClusterSnapshot, query: PickQuery, filters: Iterable[Filter], rows: Rows) -> np.ndarray:
    """bool[len(rows)]: the node is live and passes every filter."""
    ok = snapshot.live[rows]
    if isinstance(rows, slice):
        ok = ok.copy()  # a view of the column otherwise; index arrays gather a copy already
    for keep in filters:
        ok &= keep(snapshot, query, rows)
    return ok


def passing(snapshot: ClusterSnapshot, query: PickQuery, filters: Mapping[str, Filter]) -> np.ndarray:
    """Rows of live nodes that pass every filter, in row order (for policies that need no scores)."""
    return np.flatnonzero(verdict(snapshot, query, filters.values(), all_rows(snapshot)))


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
