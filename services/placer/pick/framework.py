"""The pick framework: filter -> score -> pick over one ClusterSnapshot, synchronous and pure numpy.

Filters and scorers see whole columns; the framework ANDs the filters, clamps, weights and sums the
scores, demotes degraded GPUs for latency classes, breaks ties at random, remembers which node served
each prompt prefix, and times both stages.

The ranking (everything before the tie-break) is memoized per snapshot version and query: between two
heartbeats every request for the same model and class would rank the nodes the same way, and a small
cluster's ranking costs far more in numpy call overhead than a lookup. So filters and scorers may read
from the query only what the memo key holds (model, class, caller labels, exclude, explain_top, the
prefix's row) plus now_s compared against deadline_s, which bounds how long a memoized ranking holds.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from services.common.workload import WorkloadClass
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick import nvml_bits
from services.placer.pick.filters import DEFAULT_FILTERS, Filter
from services.placer.pick.query import PickContext, PickQuery
from services.placer.pick.scorers import DEFAULT_SCORERS, Scorer
from services.placer.pick.weights import ClassWeights

logger = logging.getLogger(__name__)

TIE_TOLERANCE = 1e-9
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
    rank_us: float  # filtering, scoring and ordering, or looking up the memoized ranking
    choose_us: float  # the tie-break and the explanation


class _Ranking(NamedTuple):
    """What a decision computes before its random tie-break, reusable until the snapshot changes: the
    leaders (the ties with the best first, then runners-up; see _leaders) and what explains them."""

    # Per-leader values the chosen one is read from are Python lists: a memoized pick then makes no
    # numpy call (each costs microseconds, tens of them when the process has just woken).
    rows: list[int]  # [L] snapshot row of each leader
    totals: np.ndarray  # [L] weighted totals, less the last-resort penalty
    scores: np.ndarray  # [S, L] clamped scorer values
    ties: int  # the first `ties` leaders share the best total
    degraded: list[bool]  # [L]
    considered: int  # candidates that passed every filter
    valid_from_s: float  # the ranking holds for now_s in [valid_from_s, valid_until_s): no candidate's
    valid_until_s: float  # heartbeat deadline passes in between
    explained: dict[int, Candidate]  # leader index -> its Candidate, built on first use

    def candidate(self, i: int, snapshot: ClusterSnapshot, scorer_names: list[str]) -> Candidate:
        """Leader i as a Candidate; made once per ranking, since a memoized ranking is picked from again
        (the picks made from it share the Candidate: read it, do not change its scores)."""
        made = self.explained.get(i)
        if made is None:
            node_id = snapshot.node_ids[self.rows[i]] or ""
            scores = dict(zip(scorer_names, self.scores[:, i].tolist(), strict=True))
            made = self.explained[i] = Candidate(node_id, float(self.totals[i]), scores)
        return made


_MemoKey = tuple[str, WorkloadClass, str, str, str, frozenset[str], int, int | None]


class Picker:
    """Chooses a node per request. Keeps one piece of state: prefix_hash -> node id of its last pick."""

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
        default_slowdown_c: float = nvml_bits.DEFAULT_SLOWDOWN_TEMPERATURE_C,
        memo_capacity: int = 256,
    ) -> None:
        """Raises ValueError if weights name a scorer not in scorers or hold a negative weight.

        near_slowdown_band_c: a GPU this many degrees C below its slowdown threshold, or hotter, counts as
        degraded for the classes in avoid_degraded, like one whose thermal or power slowdown bits are set.
        memo_capacity: rankings kept for the current snapshot version; 0 ranks every request afresh.
        """
        if prefix_capacity < 0:
            raise ValueError(f"prefix_capacity must be >= 0, got {prefix_capacity}")
        self._filters = tuple(filters.values())
        self._scorers = dict(scorers)
        # Per class, the (name, scorer, weight) triples with a nonzero weight, resolved once here.
        self._plans: dict[WorkloadClass, tuple[tuple[str, Scorer, float], ...]] = {}
        for workload_class in WorkloadClass:
            plan = []
            for name, weight in weights.for_class(workload_class).items():
                if name not in self._scorers:
                    raise ValueError(f"weights for {workload_class.name} name unknown scorer {name!r}")
                if not weight >= 0:
                    raise ValueError(f"weight of {name!r} for {workload_class.name} is negative: {weight}")
                if weight > 0:
                    plan.append((name, self._scorers[name], float(weight)))
            self._plans[workload_class] = tuple(plan)
        self._plan_names = {w: [name for name, _, _ in plan] for w, plan in self._plans.items()}
        self._rng = rng if rng is not None else np.random.default_rng()
        self._uniforms: list[float] = []  # drawn from _rng in batches: one numpy call per tie-break is slow
        self._prefix_capacity = prefix_capacity
        self._prefix_nodes: OrderedDict[int, str] = OrderedDict()  # LRU, most recent last
        self._near_band_c = near_slowdown_band_c
        self._avoid_degraded = avoid_degraded
        self._default_slowdown_c = default_slowdown_c
        self._memo_capacity = memo_capacity
        self._memo: dict[_MemoKey, _Ranking] = {}
        self._memo_version = -1  # of the snapshot the memo was built on (versions are unique per process)
        self.memo_hits = 0
        self.memo_misses = 0

    def pick(self, snapshot: ClusterSnapshot, query: PickQuery) -> PickResult | None:
        """The node to serve query; None when no node passes every filter (or the model is unknown)."""
        start = time.perf_counter_ns()
        if snapshot.num_rows == 0:
            return None
        prefix_row = self._prefix_row(snapshot, query.prefix_hash)
        ranking = self._memoized(snapshot, query, prefix_row) or self._rank(snapshot, query, prefix_row)
        ranked = time.perf_counter_ns()
        if ranking is None:
            logger.debug("pick %s/%s: no candidate passed", query.model, query.workload_class.name)
            return None
        runners_up = max(query.explain_top, 0)
        position = self._draw(ranking.ties) if ranking.ties > 1 else 0
        row = ranking.rows[position]
        node_id = snapshot.node_ids[row]
        assert node_id is not None  # live rows always have an id
        self._remember(query.prefix_hash, node_id)
        names = self._plan_names[query.workload_class]
        others = [i for i in range(min(runners_up + 1, len(ranking.rows))) if i != position]
        candidates = [ranking.candidate(i, snapshot, names) for i in [position, *others[:runners_up]]]
        done = time.perf_counter_ns()
        result = PickResult(
            node_id=node_id,
            address=snapshot.addresses[row],
            row=row,
            total=candidates[0].total,
            considered=ranking.considered,
            candidates=candidates,
            last_resort=ranking.degraded[position],
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

    def _draw(self, n: int) -> int:
        """A uniform index in [0, n)."""
        if not self._uniforms:
            self._uniforms = self._rng.random(1024).tolist()
        return min(int(self._uniforms.pop() * n), n - 1)

    def _memoized(
        self, snapshot: ClusterSnapshot, query: PickQuery, prefix_row: int | None
    ) -> _Ranking | None:
        """The memoized ranking for query, if one was made on this snapshot version and still holds."""
        if snapshot.version != self._memo_version:
            self._memo.clear()
            self._memo_version = snapshot.version
        ranking = self._memo.get(_memo_key(query, prefix_row))
        if ranking is None or not ranking.valid_from_s <= query.now_s < ranking.valid_until_s:
            self.memo_misses += 1
            return None
        self.memo_hits += 1
        return ranking

    def _rank(self, snapshot: ClusterSnapshot, query: PickQuery, prefix_row: int | None) -> _Ranking | None:
        """Filter, score, weight and order the candidates, and memoize the result; None if none passed."""
        passed = snapshot.column("live").copy()  # only live rows are nodes, whatever the filters say
        for keep in self._filters:
            passed &= keep(snapshot, query)
        rows = np.flatnonzero(passed)  # [C] candidate rows
        if rows.size == 0:
            return None
        plan = self._plans[query.workload_class]
        scores = self._score(snapshot, query, rows, plan, prefix_row)  # [S, C]
        weight = np.array([w for _, _, w in plan])  # [S]
        totals = weight @ scores if plan else np.zeros(rows.size)  # [C]
        runners_up = max(query.explain_top, 0)
        leaders, ties = _leaders(totals, runners_up)  # candidate indices, the ties with the best first
        degraded = np.zeros(leaders.size, dtype=bool)  # [len(leaders)]
        if query.workload_class in self._avoid_degraded:
            # Check the leaders first; only if one of them is degraded is every candidate checked.
            degraded = self._degraded(snapshot, rows[leaders])
            if degraded.any():
                degraded_all = self._degraded(snapshot, rows)  # [C]
                # Larger than any total, so a degraded node wins only when every candidate is degraded.
                totals -= (weight.sum() + 1.0) * degraded_all
                leaders, ties = _leaders(totals, runners_up)
                degraded = degraded_all[leaders]
        # Time changes the outcome only through the healthy filter: a candidate drops out when its
        # deadline passes, and no filtered-out node comes back while time moves forward.
        ranking = _Ranking(
            rows[leaders].tolist(), totals[leaders], scores[:, leaders], ties, degraded.tolist(),
            int(rows.size),
            valid_from_s=query.now_s,
            valid_until_s=float(snapshot.deadline_s[rows].min()), explained={},
        )  # fmt: skip
        if self._memo_capacity:
            if len(self._memo) >= self._memo_capacity:
                self._memo.clear()  # many distinct queries on one version: rare, and rebuilt on demand
            self._memo[_memo_key(query, prefix_row)] = ranking
        return ranking

    def _score(
        self,
        snapshot: ClusterSnapshot,
        query: PickQuery,
        rows: np.ndarray,
        plan: tuple[tuple[str, Scorer, float], ...],
        prefix_row: int | None,
    ) -> np.ndarray:
        """[S, C] values of plan's scorers for the candidate rows, clamped to [0, 1] with NaN as 0."""
        context = PickContext(prefix_row=prefix_row)
        scores = np.empty((len(plan), rows.size))
        for i, (_, scorer, _) in enumerate(plan):
            values = np.asarray(scorer(snapshot, query, context), dtype=np.float64)  # [num_rows]
            # mode="clip": rows are in range, and with the default "raise" numpy buffers `out` (slow).
            np.take(values, rows, out=scores[i], mode="clip")
        # fmax first: it maps NaN to 0, since a scorer's NaN means "no information", not "best".
        return np.minimum(np.fmax(scores, 0.0, out=scores), 1.0, out=scores)

    def _degraded(self, snapshot: ClusterSnapshot, rows: np.ndarray) -> np.ndarray:
        """Per row in rows: a thermal sample shows slowdown bits (thermal or power) or a temperature within
        near_slowdown_band_c of the slowdown threshold."""
        reasons = snapshot.clock_event_reasons[rows]
        throttled = nvml_bits.any_bits(reasons, nvml_bits.THERMAL_SLOWDOWN | nvml_bits.POWER_SLOWDOWN)
        slowdown = nvml_bits.slowdown_threshold_c(
            snapshot.slowdown_temperature_c[rows], self._default_slowdown_c
        )
        near = snapshot.temperature_c[rows] >= slowdown - self._near_band_c
        return snapshot.has_thermal[rows] & (throttled | near)

    def _prefix_row(self, snapshot: ClusterSnapshot, prefix_hash: int | None) -> int | None:
        """Row of the node that last served prefix_hash, if it is still in the snapshot."""
        if prefix_hash is None:
            return None
        node_id = self._prefix_nodes.get(prefix_hash)
        return None if node_id is None else snapshot.row_of.get(node_id)

    def _remember(self, prefix_hash: int | None, node_id: str) -> None:
        if prefix_hash is None or self._prefix_capacity == 0:
            return
        self._prefix_nodes[prefix_hash] = node_id
        self._prefix_nodes.move_to_end(prefix_hash)
        if len(self._prefix_nodes) > self._prefix_capacity:
            self._prefix_nodes.popitem(last=False)


def _memo_key(query: PickQuery, prefix_row: int | None) -> _MemoKey:
    return (
        query.model, query.workload_class, query.caller_zone, query.caller_rack, query.caller_host,
        query.exclude, query.explain_top, prefix_row,
    )  # fmt: skip


def _leaders(totals: np.ndarray, runners_up: int) -> tuple[np.ndarray, int]:
    """(indices into totals, how many of them tie with the best). The ties (within TIE_TOLERANCE) come
    first; if there are at most runners_up of them, the next best follow, up to runners_up + 1 in all.

    Ties are not sorted: in a cluster of identical idle nodes they can be every candidate.
    """
    ties = np.flatnonzero(totals >= totals.max() - TIE_TOLERANCE)
    if ties.size > runners_up:
        return ties, int(ties.size)
    k = runners_up + 1
    top = np.argpartition(-totals, k - 1)[:k] if k < totals.size else np.arange(totals.size)
    # The top k hold every tie (ties.size < k), and sorting puts them first.
    return top[np.argsort(-totals[top], kind="stable")], int(ties.size)
