"""A RowTable's compiled twin (native.py): the same rescoring and the same ranking, one C call each.

NativeRows.create recognises the standard filters and row scorers by identity and reads their configs;
for anything else it returns None and the table stays in numpy. Request scorers need no recognising:
the standard topology scorer runs in C over the snapshot's row lists of the caller's labels (its zone
is a quarter of the fleet: in numpy, thousands of rows written and read back per pick), and every
other one runs in Python as always and hands C the rows it wrote.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
from collections.abc import Callable, Sequence

import numpy as np

from services.common.workload import WorkloadClass
from services.placer.cluster.snapshot import UNKNOWN_CODE, ClusterSnapshot, topology_keys
from services.placer.pick import filters as standard_filters
from services.placer.pick import native
from services.placer.pick import scorers as standard_scorers
from services.placer.pick.filters import Filter
from services.placer.pick.query import PickQuery
from services.placer.pick.scorers import RequestScorer, RowScorer, ScorerConfig

_ROW_SCORERS = {  # csrc/pick_rows.c's scorer kinds
    standard_scorers.model_affinity: 0,
    standard_scorers.load: 1,
    standard_scorers.batch_isolation: 2,
    standard_scorers.thermal_headroom: 3,
    standard_scorers.node_reserve: 4,
}
_CONFIGURED = (  # the scorers that take a ScorerConfig
    standard_scorers.batch_isolation,
    standard_scorers.thermal_headroom,
    standard_scorers.node_reserve,
)
_REQUIRED_FILTERS = (standard_filters.healthy, standard_filters.model_loadable, standard_filters.memory)
_FILTERS = (*_REQUIRED_FILTERS, standard_filters.not_thermally_critical)  # the last one optional
_LABEL_COLUMNS = ("zone", "rack", "host")
_NO_ROWS = np.zeros(1, dtype=np.int64)  # an address for an empty row list
_ADDRESSES_KEPT = 1024
_Bound = dict[Callable[..., object], dict[str, object]]  # function -> the keywords bound to it


def is_topology(scorer: RequestScorer) -> bool:
    """The standard topology scorer, which the C ranking computes itself."""
    return scorer.score is standard_scorers.topology


class NativeRows:
    """The C structures of one RowTable, bound to a snapshot's columns and the table's arrays."""

    def __init__(self, lib: ctypes.CDLL, table: native.Table, model: str, avoids_degraded: bool) -> None:
        self._lib = lib
        self._avoids_degraded = avoids_degraded
        self._table = table
        self._model = model
        self._columns = native.Columns()
        self._until = ctypes.c_double()
        self._ties = ctypes.c_int64()
        self._request = native.Request()
        # byref once: the structures live as long as this object.
        self._refs = tuple(map(ctypes.byref, (self._columns, table, self._until, self._request, self._ties)))
        self._kept: tuple[object, ...] = ()  # arrays whose addresses the structures hold
        self._address = native.Addresses(_ADDRESSES_KEPT)  # label lists, request scorers' buffers
        self._labels_of: tuple[ClusterSnapshot, int] | None = None  # what _callers was resolved against
        self._callers: dict[tuple[str, str, str], tuple[list[int], list[int], list[int]]] = {}
        self.leader_totals = self.leaders = self.topology = np.zeros(0)
        self._scratch: tuple[np.ndarray, ...] = ()  # the ranking's, addressed by _request
        self._seen = np.zeros(0, dtype=np.uint8)
        self._rows: list[np.ndarray] = []  # scratch: rows handed to C, per request slot, then one more
        self._row_addresses: list[int] = []
        self._outputs: tuple[int, int, int] = (0, 0, 0)  # addresses of leader_totals, leaders, topology

    @classmethod
    def create(
        cls,
        model: str,
        workload_class: WorkloadClass,
        filters: Sequence[Filter],
        scorers: Sequence[RowScorer],
        weights: Sequence[float],
        degraded: tuple[float, float] | None,
        penalty: float,
        request_scorers: int,
    ) -> NativeRows | None:
        """None unless the library loads, filters and row scorers are the standard ones, and there are
        at most native.MAX_REQUEST request scorers. degraded: (near_slowdown_band_c, default_slowdown_c)
        of the Picker's last-resort test, or None when the class never avoids a degraded GPU."""
        lib = native.library()
        filter_config = _filter_config(filters)
        kinds = [_scorer_kind(scorer) for scorer in scorers]
        if lib is None or filter_config is None or None in kinds or len(kinds) > native.MAX_SCORERS:
            return None
        if request_scorers > native.MAX_REQUEST:
            return None
        configs = {config for _, config in kinds if config is not None}  # type: ignore[misc]
        if len(configs) > 1:
            return None  # two scorers with different configs: one Table holds one
        config = configs.pop() if configs else ScorerConfig()
        table = native.Table(
            n_scorers=len(kinds),
            scorer=native.pack([kind for kind, _ in kinds], ctypes.c_int64, native.MAX_SCORERS),  # type: ignore[misc]
            weight=native.pack(weights, ctypes.c_double, native.MAX_SCORERS),
            batch=int(workload_class == WorkloadClass.BATCH),
            penalty=penalty,
            near_band_c=degraded[0] if degraded else 0.0,
            degraded_slowdown_c=degraded[1] if degraded else 0.0,
            thermal_filter=int(filter_config[2]),
            kv_full_fraction=filter_config[0],
            shutdown_margin_c=filter_config[1],
            span_c=config.thermal_span_c,
            horizon_s=config.thermal_horizon_s,
            scorer_slowdown_c=config.default_slowdown_c,
            no_sample=config.no_sample_thermal_score,
            batch_kv=config.batch_kv_limit,
            reserve_fraction=config.node_reserve_fraction,
        )
        return cls(lib, table, model, avoids_degraded=degraded is not None)

    def bind(
        self,
        snapshot: ClusterSnapshot,
        passed: np.ndarray,
        degraded: np.ndarray,
        base: np.ndarray,
        scores: np.ndarray,
    ) -> None:
        """Point the structures at snapshot's columns and the table's arrays; again whenever either is
        reallocated (a new snapshot epoch, which the table's full rescore follows)."""
        model = snapshot.models.get(self._model)
        columns = {
            "live": snapshot.live, "draining": snapshot.draining, "has_thermal": snapshot.has_thermal,
            "deadline_s": snapshot.deadline_s, "running": snapshot.running, "waiting": snapshot.waiting,
            "max_running": snapshot.max_running, "batch_running": snapshot.batch_running,
            "batch_waiting": snapshot.batch_waiting, "kv_usage": snapshot.kv_usage,
            "memory_free_bytes": snapshot.memory_free_bytes, "temperature_c": snapshot.temperature_c,
            "slowdown_c": snapshot.slowdown_temperature_c, "shutdown_c": snapshot.shutdown_temperature_c,
            "trend": snapshot.temperature_trend_c_per_s, "reasons": snapshot.clock_event_reasons,
            "zone": snapshot.zone, "rack": snapshot.rack, "host": snapshot.host,
            "reserve_rank": snapshot.reserve_rank,
        }  # fmt: skip
        if model is not None:
            columns |= {"resident": model.resident, "host_copy": model.host_copy, "listed": model.listed}
            self._columns.weight_bytes = float(model.weight_bytes)
        else:  # C reads a NULL residency as a model no node reported: every row refused
            self._columns.resident = self._columns.host_copy = self._columns.listed = None
        for name, array in columns.items():
            setattr(self._columns, name, native.address(array))
        table = self._table
        table.passed, table.base, table.scores = map(native.address, (passed, base, scores))
        table.degraded = native.address(degraded) if self._avoids_degraded else None
        table.capacity = passed.size
        self._seen = np.zeros(passed.size, dtype=np.uint8)  # rescore_rows's scratch
        table.seen = native.address(self._seen)
        capacity = snapshot.capacity
        if self.leaders.size != capacity:
            self._address.clear()
            self.leader_totals = np.zeros(capacity)
            self.leaders = np.zeros(capacity, dtype=np.int64)
            self.topology = np.zeros(capacity)
            # Rows handed to C: a stretch per request slot, then one for exclusions and rescores.
            self._rows = [np.zeros(capacity, dtype=np.int64) for _ in range(native.MAX_REQUEST + 1)]
            self._row_addresses = [native.address(rows) for rows in self._rows]
            self._outputs = tuple(map(native.address, (self.leader_totals, self.leaders, self.topology)))
            scratch = {
                "touched": np.zeros(capacity, dtype=np.uint8), "seen": np.zeros(capacity, dtype=np.uint8),
                "adjusted": np.zeros(capacity), "touched_rows": np.zeros(capacity, dtype=np.int64),
            }  # fmt: skip
            for name, array in scratch.items():
                setattr(self._request, name, native.address(array))
            self._scratch = tuple(scratch.values())
        self._kept = (*columns.values(), passed, degraded, base, scores)

    def _caller_labels(self, snapshot: ClusterSnapshot, query: PickQuery) -> None:
        """The caller's label codes, and the rows carrying each (the snapshot keeps those lists).
        Remembered per caller until the snapshot's labels move (label_epoch): callers are few, picks
        many."""
        struct = self._request
        if (
            self._labels_of is None
            or self._labels_of[0] is not snapshot
            or self._labels_of[1] != snapshot.label_epoch
            or len(self._callers) > _ADDRESSES_KEPT
        ):
            self._labels_of = (snapshot, snapshot.label_epoch)
            self._callers.clear()
        caller = (query.caller_zone, query.caller_rack, query.caller_host)
        known = self._callers.get(caller)
        if known is None:
            known = self._callers[caller] = self._resolve_labels(snapshot, caller)
        codes, addresses, counts = known
        for level in range(len(_LABEL_COLUMNS)):
            struct.labelled[level] = addresses[level]
            struct.n_labelled[level] = counts[level]
        struct.zone, struct.rack, struct.host = codes

    def _resolve_labels(
        self, snapshot: ClusterSnapshot, caller: tuple[str, str, str]
    ) -> tuple[list[int], list[int], list[int]]:
        """(codes, addresses of the rows carrying each, their counts) of a caller's zone, rack and host."""
        codes, addresses, counts = [], [], []
        for column, label in zip(_LABEL_COLUMNS, topology_keys(*caller), strict=True):
            code = snapshot.known_code(label)
            rows = _NO_ROWS if code == UNKNOWN_CODE else snapshot.labelled(column, code)
            codes.append(code)
            addresses.append(self._address(rows))
            counts.append(0 if code == UNKNOWN_CODE else rows.size)
        return codes, addresses, counts

    def _staged(self, slot: int, rows: Sequence[int] | np.ndarray) -> tuple[int, int]:
        """rows copied into scratch slot: (its address, how many)."""
        count = len(rows)
        if count:
            if count > self._rows[slot].size:  # never at the sizes tables hand over; correct regardless
                self._rows[slot] = np.zeros(count, dtype=np.int64)
                self._row_addresses[slot] = native.address(self._rows[slot])
            if count == 1:  # a point scorer's row: a scalar write is a fraction of a slice's
                self._rows[slot][0] = rows[0]
            else:
                self._rows[slot][:count] = rows
        return self._row_addresses[slot], count

    def rescore(
        self, rows: Sequence[int] | np.ndarray | None, n: int, now: float, valid_until: float
    ) -> tuple[int, float]:
        """Rescore rows (repeats allowed; None: rows 0..n) at now: (change in the passed count, the new
        valid_until)."""
        self._until.value = valid_until
        pointer, n = (None, n) if rows is None else self._staged(native.MAX_REQUEST, rows)
        columns, table, until, _, _ = self._refs
        return self._lib.rescore_rows(columns, table, pointer, n, now, until), self._until.value

    def rank(
        self,
        snapshot: ClusterSnapshot,
        query: PickQuery,
        request: Sequence[tuple[str, RequestScorer, float]],
        sparse: Callable[[str, RequestScorer], tuple[np.ndarray, np.ndarray | None]],
        excluded: Sequence[int],
        tolerance: float,
        runners_up: int,
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """(the leaders' totals, the leaders as rank_leaders returns them, how many tie with the best).
        sparse(name, scorer): a non-topology scorer's (clamped values buffer, rows written or None),
        run by the Picker. Afterwards self.topology[i] is leaders[i]'s topology score."""
        struct = self._request
        for k, (name, scorer, weight) in enumerate(request):
            struct.weight[k] = weight
            if is_topology(scorer):
                struct.kind[k] = native.TOPOLOGY
                self._caller_labels(snapshot, query)
                continue
            values, rows = sparse(name, scorer)
            struct.kind[k] = native.SPARSE
            struct.rows[k], struct.n_rows[k] = self._staged(k, _NO_ROWS[:0] if rows is None else rows)
            struct.values[k] = self._address(values)
        struct.n_request = len(request)
        struct.excluded, struct.n_excluded = self._staged(native.MAX_REQUEST, excluded)
        columns, _, _, request_ref, ties = self._refs
        count = self._lib.rank_rows(
            columns, self._table.base, snapshot.num_rows, request_ref, tolerance, runners_up,
            *self._outputs, ties,
        )  # fmt: skip
        return self.leader_totals[:count], self.leaders[:count], self._ties.value


def _filter_config(filters: Sequence[Filter]) -> tuple[float, float, bool] | None:
    """(kv_full_fraction, shutdown_margin_c, whether not_thermally_critical is one) when filters are the
    standard ones: all four, or all but not_thermally_critical."""
    found: _Bound = {}
    for keep in filters:
        func, keywords = _unbound(keep)
        if func not in _FILTERS or found.setdefault(func, keywords) != keywords:
            return None
    if not set(_REQUIRED_FILTERS) <= found.keys():
        return None
    kv = _keyword(found, standard_filters.memory, "kv_full_fraction")
    thermal = standard_filters.not_thermally_critical in found
    margin = _keyword(found, standard_filters.not_thermally_critical, "shutdown_margin_c") if thermal else 0.0
    return float(kv), float(margin), thermal  # type: ignore[arg-type]


def _scorer_kind(scorer: RowScorer) -> tuple[int, ScorerConfig | None] | None:
    func, keywords = _unbound(scorer)
    kind = _ROW_SCORERS.get(func)  # type: ignore[call-overload]
    if kind is None or set(keywords) - {"config"}:
        return None
    if func not in _CONFIGURED:
        return kind, None
    config = keywords.get("config", ScorerConfig())
    return (kind, config) if isinstance(config, ScorerConfig) else None


def _unbound(func: Callable[..., object]) -> tuple[Callable[..., object], dict[str, object]]:
    """A function and the keywords bound to it by functools.partial (no positional arguments)."""
    if isinstance(func, functools.partial) and not func.args:
        return func.func, dict(func.keywords)
    return func, {}


def _keyword(found: _Bound, func: Callable[..., object], name: str) -> object:
    """The keyword bound to func, else its default."""
    return found[func].get(name, inspect.signature(func).parameters[name].default)
