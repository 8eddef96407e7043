"""The pick framework: filter -> score -> pick over one ClusterSnapshot, synchronous and pure numpy.

Filters and scorers see columns; the framework ANDs the filters, clamps, weights and sums the scores,
demotes degraded GPUs for latency classes, breaks ties at random, remembers which node served each
prompt prefix, and times both stages.

Per model and class, a RowTable keeps every row's filter verdict and row-scorer total, rescoring only
the rows the snapshot wrote since the last pick (table.py); a pick adds the request's own scorers
(topology, prefix) onto those totals and takes the best. So a pick's cost barely grows with the fleet:
at 8,000 workers it rescores the few rows heartbeats and telemetry changed, not every column.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from services.common.workload import WorkloadClass
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick import nvml_bits
from services.placer.pick.filters import DEFAULT_FILTERS, Filter, Rows
from services.placer.pick.leaders import TIE_TOLERANCE, rank_leaders
from services.placer.pick.memo import PrefixMemo, TieBreak
from services.placer.pick.native_rows import NativeRows, is_topology
from services.placer.pick.plan import Plan, plan_of
from services.placer.pick.prefix_cost import (
    DEFAULT_PREFIX_BALANCE,
    PREFIX_COST_CLASSES,
    PrefixBalance,
    keep_prefix,
)
from services.placer.pick.query import PickContext, PickQuery
from services.placer.pick.scorers import (
    DEFAULT_SCORERS,
    RequestScorer,
    Scorer,
    clamp_score,
    clamp_scores,
)
from services.placer.pick.table import RowTable
from services.placer.pick.weights import ClassWeights

logger = logging.getLogger(__name__)

# Classes for which a throttled or nearly throttled GPU is a last resort: those with a latency SLO, plus
# unclassified requests, which are weighted like agent steps.
DEFAULT_AVOID_DEGRADED = frozenset(
    {wc for wc in WorkloadClass if wc.latency_sensitive} | {WorkloadClass.UNSPECIFIED}
)


class Candidate(NamedTuple):
    node_id: str
    total: float  # weighted sum of scores, less the last-resort penalty where it applied
    scores: dict[str, float]  # scorer name -> value in [0, 1], before weighting


@dataclass(frozen=True)
class PickResult:
    node_id: str
    address: str
    row: int  # snapshot row of the chosen node; valid only for the snapshot that was picked from
    total: float
    considered: int  # nodes that passed every filter
    candidates: list[Candidate]  # the chosen one first, then up to query.explain_top runners-up, best first
    last_resort: bool  # the chosen node is degraded (throttled or near slowdown) and nothing else was left
    # The prefix cost rule (prefix_cost.py) chose the node holding the prompt's prefix over the ranked
    # winner, which is then the first runner-up.
    prefix_kept: bool
    # Tokens of the prompt's remembered prefix the chosen node holds (0 where the memo points elsewhere):
    # what the node will not compute again, so what its latency prefill grows by is the rest.
    cached_tokens: int
    rank_us: float  # bringing the rows up to date, the request's scorers and ordering
    choose_us: float  # the tie-break and the explanation


class _Ranking(NamedTuple):
    """A pick's leading rows, best first, with their totals, and the compiled ranking's topology score
    per leader (None from the numpy ranking, whose topology scores are in the scorer's buffer)."""

    leaders: np.ndarray
    totals: np.ndarray
    topology: np.ndarray | None


class Picker:
    """Chooses a node per request. Keeps each prompt prefix -> node id of its last pick, and a RowTable per
    model and class (rebuilt from the snapshot whenever it cannot be brought up to date)."""

    def __init__(
        self,
        weights: ClassWeights,
        filters: Mapping[str, Filter] = DEFAULT_FILTERS,
        scorers: Mapping[str, Scorer] = DEFAULT_SCORERS,
        rng: np.random.Generator | None = None,
        prefix_capacity: int = 100_000,
        *,
        near_slowdown_band_c: float = 3.0,
        avoid_degraded: frozenset[WorkloadClass] = DEFAULT_AVOID_DEGRADED,
        prefix_cost_classes: frozenset[WorkloadClass] = PREFIX_COST_CLASSES,
        prefix_balance: PrefixBalance = DEFAULT_PREFIX_BALANCE,
        default_slowdown_c: float = nvml_bits.DEFAULT_SLOWDOWN_TEMPERATURE_C,
        incremental: bool = True,
        compiled: bool = True,
    ) -> None:
        """Raises ValueError if weights name a scorer not in scorers or hold a negative weight.

        near_slowdown_band_c: a GPU this many degrees C below its slowdown threshold, or hotter, counts as
        degraded for the classes in avoid_degraded, like one whose thermal or power slowdown bits are set.
        prefix_cost_classes: the classes whose picks the prefix cost rule (prefix_cost.py) may move to
        the node holding their prompt's prefix; empty turns it off. prefix_balance: where that node is
        too busy against the ranked winner for its prefix to be followed.
        incremental=False rescores every row on every pick: the same decisions, slower (the reference
        the tests and the placer bench compare against). compiled=False keeps every table in numpy even
        where the compiled pick (native.py) could serve its filters and scorers: the same decisions.
        """
        self._filters = tuple(filters.values())
        self._plans = {wc: plan_of(weights, dict(scorers), wc) for wc in WorkloadClass}
        self._tie_break = TieBreak(rng if rng is not None else np.random.default_rng())
        self._prefixes = PrefixMemo(prefix_capacity)
        self._near_band_c = near_slowdown_band_c
        self._avoid_degraded = avoid_degraded
        self._prefix_cost_classes = prefix_cost_classes
        self._prefix_balance = prefix_balance
        self._default_slowdown_c = default_slowdown_c
        self._incremental = incremental
        self._compiled = compiled
        self._tables: dict[tuple[str, WorkloadClass], RowTable] = {}
        self._buffers: dict[str, np.ndarray] = {}  # reused per pick, so a pick allocates nothing fleet-sized
        self._points: dict[str, np.ndarray] = {}  # a point scorer's row, reused per pick
        self.full_rescores = 0  # refreshes that rescored every row
        self.rows_rescored = 0  # rows rescored by the other refreshes
        self.prefix_kept = 0  # picks the prefix cost rule moved to the node holding the prompt's prefix

    def pick(self, snapshot: ClusterSnapshot, query: PickQuery) -> PickResult | None:
        """The node to serve query; None when no node passes every filter (or the model is unknown)."""
        start = time.perf_counter_ns()
        if snapshot.num_rows == 0 or query.model not in snapshot.models:
            return None
        plan = self._plans[query.workload_class]
        table = self._table(query, plan)
        rescored = table.refresh(snapshot, query, self._incremental)
        if rescored == snapshot.num_rows:
            self.full_rescores += 1
        else:
            self.rows_rescored += rescored
        excluded_rows = sorted({r for r in map(snapshot.row_of.get, query.exclude) if r is not None})
        considered = table.count - sum(bool(table.passed[r]) for r in excluded_rows)
        if considered <= 0:
            logger.debug("pick %s/%s: no candidate passed", query.model, query.workload_class.name)
            return None
        runners_up = max(query.explain_top, 0)
        written: dict[str, np.ndarray] = {}
        prefix_row, matched = self._prefixes.match(snapshot, query.prefix_chain)
        context = PickContext(prefix_row=prefix_row, prefix_tokens=query.prefix_tokens(matched))
        if table.native is not None:
            leader_totals, leaders, ties = table.native.rank(
                snapshot, query, plan.request,
                lambda name, scorer: self._request_scores(name, scorer, snapshot, query, context, written),
                excluded_rows, TIE_TOLERANCE, runners_up,
            )  # fmt: skip
            ranking = _Ranking(leaders, leader_totals, table.native.topology)
        else:
            totals = self._totals(snapshot, query, plan, table, context, excluded_rows, written)
            leaders, ties = rank_leaders(totals, runners_up, considered, 2 * plan.weight_sum + 1.0)
            ranking = _Ranking(leaders, totals[leaders], None)
        ranked = time.perf_counter_ns()
        position = self._tie_break.draw(ties) if ties > 1 else 0
        row = int(leaders[position])
        prefix_kept = query.workload_class in self._prefix_cost_classes and keep_prefix(
            snapshot, query, context, row, table, excluded_rows, self._prefix_balance
        )
        if prefix_kept:
            self.prefix_kept += 1
            assert prefix_row is not None
            row, position = prefix_row, 0
            ranking = self._put_first(row, snapshot, query, plan, table, context, written, ranking)
        node_id = snapshot.node_ids[row]
        assert node_id is not None  # live rows always have an id
        self._prefixes.remember(query.prefix_chain, node_id)
        others = [i for i in range(min(runners_up + 1, len(ranking.leaders))) if i != position]
        shown = [position, *others[:runners_up]]
        candidates = self._explain(snapshot, plan, table, written, ranking, shown)
        self._clear(written)
        done = time.perf_counter_ns()
        result = PickResult(
            node_id=node_id,
            address=snapshot.addresses[row],
            row=row,
            total=candidates[0].total,
            considered=considered,
            candidates=candidates,
            last_resort=bool(table.degraded[row]),
            prefix_kept=prefix_kept,
            cached_tokens=context.prefix_tokens if row == prefix_row else 0,
            rank_us=(ranked - start) / 1e3,
            choose_us=(done - ranked) / 1e3,
        )
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "pick %s/%s -> %s total=%.3f considered=%d last_resort=%s rank=%.0fus choose=%.0fus top=%s",
                query.model, query.workload_class.name, node_id, result.total, result.considered,
                result.last_resort, result.rank_us, result.choose_us, candidates,
            )  # fmt: skip
        return result

    def _put_first(
        self,
        row: int,
        snapshot: ClusterSnapshot,
        query: PickQuery,
        plan: Plan,
        table: RowTable,
        context: PickContext,
        written: dict[str, np.ndarray],
        ranking: _Ranking,
    ) -> _Ranking:
        """ranking with row (a node it did not choose) first and its leaders after it, row left out of
        them. row's total adds its request scores onto the table's base as the ranking does; the compiled
        ranking kept its topology scores to itself, so that scorer runs here, once."""
        compiled = ranking.topology is not None
        total = float(table.base[row])
        for name, scorer, weight in plan.request:
            if name not in written and compiled and is_topology(scorer):
                self._request_scores(name, scorer, snapshot, query, context, written)
            if name in written:
                total += weight * float(self._buffers[name][row])
        others = ranking.leaders != row
        topology = None
        if ranking.topology is not None:
            kept = [self._buffers[name][row] for name, scorer, _ in plan.request if is_topology(scorer)]
            # The compiled array outlasts its leaders: cut it to theirs.
            topology = np.concatenate((kept or [0.0], ranking.topology[: others.size][others]))
        leaders = np.concatenate(([row], ranking.leaders[others]))
        return _Ranking(leaders, np.concatenate(([total], ranking.totals[others])), topology)

    def _table(self, query: PickQuery, plan: Plan) -> RowTable:
        key = (query.model, query.workload_class)
        table = self._tables.get(key)
        if table is None:
            avoid = query.workload_class in self._avoid_degraded
            scorers = [scorer for _, scorer, _ in plan.row]
            weights = [weight for _, _, weight in plan.row]
            penalty = plan.weight_sum + 1.0  # larger than any total
            native = None
            if self._compiled:
                degraded = (self._near_band_c, self._default_slowdown_c) if avoid else None
                native = NativeRows.create(
                    query.model, query.workload_class, self._filters, scorers, weights, degraded, penalty,
                    len(plan.request),
                )  # fmt: skip
            table = self._tables[key] = RowTable(
                self._filters, scorers, weights, self._degraded if avoid else None, penalty, native
            )
        return table

    def _totals(
        self,
        snapshot: ClusterSnapshot,
        query: PickQuery,
        plan: Plan,
        table: RowTable,
        context: PickContext,
        excluded_rows: list[int],
        written: dict[str, np.ndarray],
    ) -> np.ndarray:
        """Every row's total for this request, -inf on excluded_rows; the rows each request scorer wrote
        go into written, its clamped values left in its buffer until _clear. The table's base itself
        when the request adds nothing; otherwise a reused buffer."""
        n = snapshot.num_rows
        for name, scorer, _ in plan.request:
            self._request_scores(name, scorer, snapshot, query, context, written)
        if not written and not excluded_rows:
            return table.base[:n]
        totals = self._buffer(" totals", snapshot)[:n]
        np.copyto(totals, table.base[:n])
        for name, _, weight in plan.request:
            rows = written.get(name)
            if rows is not None:
                totals[rows] += self._buffers[name][rows] * weight  # a repeated row adds once
        totals[excluded_rows] = -np.inf
        return totals

    def _request_scores(
        self,
        name: str,
        scorer: RequestScorer,
        snapshot: ClusterSnapshot,
        query: PickQuery,
        context: PickContext,
        written: dict[str, np.ndarray],
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Run one request scorer into its buffer (all 0 before, see _clear) and clamp what it wrote:
        (the whole buffer, the rows it wrote or None); the rows also go into written."""
        buffer = self._buffer(name, snapshot)
        if scorer.point is not None:  # at most one row: scalar writes
            found = scorer.point(snapshot, query, context)
            if found is None:
                return buffer, None
            row, value = found
            if not 0 <= row < snapshot.num_rows:  # the buffer is the capacity's: a bad row would stay
                raise ValueError(
                    f"request scorer {name!r} pointed at row {row}, outside the snapshot's"
                    f" {snapshot.num_rows} rows"
                )
            buffer[row] = clamp_score(value)
            point = self._points.get(name)
            if point is None:
                point = self._points[name] = np.zeros(1, dtype=np.int64)
            point[0] = row
            written[name] = point
            return buffer, point
        out = buffer[: snapshot.num_rows]
        rows = scorer.score(snapshot, query, context, out)
        if rows is None or not rows.size:
            return buffer, None
        out[rows] = clamp_scores(out[rows])  # read after every write: the last one counts
        written[name] = rows
        return buffer, rows

    def _clear(self, written: dict[str, np.ndarray]) -> None:
        """Zero what request scorers wrote, so their buffers are all 0 for the next pick."""
        for name, rows in written.items():
            if rows.size == 1:
                self._buffers[name][rows[0]] = 0.0
            else:
                self._buffers[name][rows] = 0.0

    def _buffer(self, name: str, snapshot: ClusterSnapshot) -> np.ndarray:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < snapshot.num_rows:
            buffer = self._buffers[name] = np.zeros(snapshot.capacity)
        return buffer

    def _explain(
        self,
        snapshot: ClusterSnapshot,
        plan: Plan,
        table: RowTable,
        written: dict[str, np.ndarray],
        ranking: _Ranking,
        shown: list[int],
    ) -> list[Candidate]:
        """ranking's leaders at positions shown, with their totals and scores. Scalar reads per leader:
        the gateway shows one (explain_top 0) on every pick, where gathering arrays cost more than the
        reads."""
        candidates = []
        topology = ranking.topology
        for position in shown:
            row = int(ranking.leaders[position])
            scores = dict(zip(plan.row_names, table.scores[:, row].tolist(), strict=True))
            for name, scorer, _ in plan.request:
                if topology is not None and is_topology(scorer):
                    scores[name] = float(topology[position])
                else:
                    scores[name] = float(self._buffers[name][row]) if name in written else 0.0
            ordered = {name: scores[name] for name in plan.names}
            total = float(ranking.totals[position])
            candidates.append(Candidate(snapshot.node_ids[row] or "", total, ordered))
        return candidates

    def _degraded(self, snapshot: ClusterSnapshot, rows: Rows) -> np.ndarray:
        """Per row in rows: a thermal sample shows slowdown bits (thermal or power) or a temperature within
        near_slowdown_band_c of the slowdown threshold."""
        reasons = snapshot.clock_event_reasons[rows]
        throttled = nvml_bits.any_bits(reasons, nvml_bits.THERMAL_SLOWDOWN | nvml_bits.POWER_SLOWDOWN)
        slowdown = nvml_bits.slowdown_threshold_c(
            snapshot.slowdown_temperature_c[rows], self._default_slowdown_c
        )
        near = snapshot.temperature_c[rows] >= slowdown - self._near_band_c
        return snapshot.has_thermal[rows] & (throttled | near)
