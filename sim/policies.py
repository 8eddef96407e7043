"""Routing policies compared on the same trace, each deciding from the placer's cluster state.

`ours` is the placer's own decision, unchanged: the Picker with the default filters, scorers, per-class
weights, memo and tie-break, exactly as PlacerReplica.choose runs it. The others are what a fleet would
otherwise run: random, round-robin and power-of-two choices over the nodes that can take the model;
least-loaded (the placer's load score alone); and prefix + load in llm-d's default weighting (its queue
scorer at 2, prefix cache at 3), defined on the same Picker framework with llm-d's queue scorer and its
prefix-cache scorer over llm-d's approximate prefix index (sim/llm_d_prefix.py) (prefix_load_picker),
and run as a direct ranking that takes the same node (prefix_load). None of the baselines reads
temperature.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from services.common.workload import WorkloadClass
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.cluster.state import ClusterState
from services.placer.pick import filters, scorers
from services.placer.pick.framework import TIE_TOLERANCE, Picker
from services.placer.pick.memo import TieBreak
from services.placer.pick.native_rows import NativeRows
from services.placer.pick.prefix_cost import PREFIX_COST_CLASSES
from services.placer.pick.query import PickContext, PickQuery
from services.placer.pick.scorers import RequestScorer, ScorerConfig
from services.placer.pick.table import RowTable
from services.placer.pick.weights import ClassWeights
from sim.llm_d_prefix import BLOCK_TOKENS, LlmDPrefixIndex
from sim.prefix_load_native import PrefixLoadRanking


class Choice(NamedTuple):
    """A policy's decision: the chosen node, and the tokens of the prompt's remembered prefix it holds as
    the policy's prefix memo knows them (PickResult.cached_tokens; 0 for a policy without a memo)."""

    node_id: str
    cached_tokens: int = 0


# A policy: (state, query) -> its Choice, or None when no node can take it. The simulation expires
# nodes past their deadline before and records the pick in the state after (ClusterState.expire and
# record_pick), as PlacerReplica.choose does, for every policy.
Policy = Callable[[ClusterState, PickQuery], Choice | None]

_BASE_FILTERS = {
    "healthy": filters.healthy,
    "model_loadable": filters.model_loadable,
    "memory": filters.memory,
}


def llm_d_queue(
    snapshot: ClusterSnapshot, query: PickQuery, context: PickContext, out: np.ndarray
) -> np.ndarray | None:
    """llm-d's queue scorer: (max - waiting) / (max - min) over the nodes, 1 where all wait alike. The
    range is the fleet's at this request, so it is a request scorer, rerun on every pick."""
    waiting = snapshot.column("waiting")
    low, high = float(waiting.min(initial=0.0)), float(waiting.max(initial=0.0))
    if high == low:
        out[:] = 1.0
    else:
        np.divide(high - waiting, high - low, out=out)
    return np.arange(snapshot.num_rows)


class LlmDPrefix:
    """llm-d's prefix-cache scorer: each server's blocks of the prompt in its approximate prefix index
    over the prompt's blocks (sim/llm_d_prefix.py), whatever that server's queue (ours fades with the
    queue, scorers.prefix_affinity). score() is the Picker's RequestScorer; placed() tells the index
    where a request went, as llm-d's PreRequest does."""

    def __init__(self, server_blocks: Callable[[str], int] | None = None) -> None:
        self.index = LlmDPrefixIndex(server_blocks)

    def score(
        self, snapshot: ClusterSnapshot, query: PickQuery, context: PickContext, out: np.ndarray
    ) -> np.ndarray | None:
        rows, held, total = self.index.match(snapshot, query)
        if not rows.size:
            return None
        out[rows] = held / total
        return rows

    def placed(self, snapshot: ClusterSnapshot, query: PickQuery, node_id: str) -> int:
        """Record that query went to node_id; the prompt tokens the index held there (whole blocks)."""
        held = self.index.held(snapshot, query).get(node_id, 0)
        self.index.add(query, node_id)
        return held * BLOCK_TOKENS


def _uniform(weights: dict[str, float]) -> ClassWeights:
    return ClassWeights(MappingProxyType({wc: MappingProxyType(dict(weights)) for wc in WorkloadClass}))


def picker_policy(picker: Picker) -> Policy:
    def choose(state: ClusterState, query: PickQuery) -> Choice | None:
        result = picker.pick(state.snapshot, query)
        return None if result is None else Choice(result.node_id, result.cached_tokens)

    return choose


def ours(seed: int, weights: ClassWeights | None = None) -> Policy:
    """The placer's Picker with its per-class weights (None: the defaults; a placer takes overrides from
    HANZO_PLACER_WEIGHTS_FILE, the simulator from --weights, in the same JSON form)."""
    return picker_policy(ours_picker(seed, weights))


def ours_picker(
    seed: int,
    weights: ClassWeights | None = None,
    prefix_cost: bool = True,
    scorer_config: ScorerConfig | None = None,
) -> Picker:
    """ours's Picker; prefix_cost=False turns its prefix cost rule off (the experiment
    ours_no_prefix_cost: ours as it was before the rule); scorer_config: the scorers' constants, as the
    placer's settings give them (None: the defaults)."""
    chosen = weights or ClassWeights.defaults()
    classes = PREFIX_COST_CLASSES if prefix_cost else frozenset()
    return Picker(
        chosen,
        scorers=scorers.build_scorers(scorer_config),
        rng=np.random.default_rng([seed, 20]),
        prefix_cost_classes=classes,
    )


def least_loaded(seed: int) -> Policy:
    picker = Picker(
        _uniform({"load": 1.0}),
        filters=_BASE_FILTERS,
        scorers={"load": scorers.load},
        rng=np.random.default_rng([seed, 21]),
        avoid_degraded=frozenset(),
        prefix_cost_classes=frozenset(),  # ours' rule, not the baseline's
    )
    return picker_policy(picker)


_PREFIX_LOAD_WEIGHTS = {"queue": 2.0, "prefix_affinity": 3.0}  # llm-d's default weighting


def prefix_load_picker(seed: int, server_blocks: Callable[[str], int] | None = None) -> Policy:
    """prefix + load as the placer's Picker runs it with llm-d's two scorers: the definition. The
    comparison runs prefix_load, which takes the same decisions without scoring every row.
    server_blocks: each server's KV blocks, llm-d's auto-tuned index capacity (LlmDPrefixIndex)."""
    prefix = LlmDPrefix(server_blocks)
    picker = Picker(
        _uniform(_PREFIX_LOAD_WEIGHTS),
        filters=_BASE_FILTERS,
        scorers={"queue": RequestScorer(llm_d_queue), "prefix_affinity": RequestScorer(prefix.score)},
        rng=np.random.default_rng([seed, 22]),
        prefix_capacity=0,  # llm-d's index, not the placer's memo, knows where prefixes went
        avoid_degraded=frozenset(),
        prefix_cost_classes=frozenset(),  # ours' rule, not the baseline's
    )

    def choose(state: ClusterState, query: PickQuery) -> Choice | None:
        result = picker.pick(state.snapshot, query)
        if result is None:
            return None
        return Choice(result.node_id, prefix.placed(state.snapshot, query, result.node_id))

    return choose


class _Candidates:
    """The rows filters.passing(snapshot, query, _BASE_FILTERS) returns, in row order, kept per model by
    a filters-only RowTable (compiled where it can be) that refreshes only the rows written since the
    last pick: at 1,000 GPUs, re-filtering every row on every pick was most of these policies' cost."""

    def __init__(self) -> None:
        self._tables: dict[str, RowTable] = {}

    def __call__(self, state: ClusterState, query: PickQuery) -> np.ndarray:
        # nonzero on the 1-d mask itself: np.flatnonzero's ravel and dispatch cost as much again.
        return self.passed(state, query)[: state.snapshot.num_rows].nonzero()[0]

    def passed(self, state: ClusterState, query: PickQuery) -> np.ndarray:
        """Per row (the snapshot's capacity), whether it passes: the table's own array, to be read only."""
        table = self._tables.get(query.model)
        if table is None:
            chosen = tuple(_BASE_FILTERS.values())
            native = NativeRows.create(query.model, query.workload_class, chosen, [], [], None, 1.0, 0)
            table = self._tables[query.model] = RowTable(chosen, [], [], None, 1.0, native)
        table.refresh(state.snapshot, query)
        return table.passed


class _PrefixLoad:
    """prefix_load_picker's decisions, pick for pick, without its per-pick work over every row.

    llm-d's queue scorer writes every row (its range is the fleet's at this request), so through the
    Picker a pick cost 74 us at 1,000 GPUs. Its ranking is simple enough to take directly: a candidate
    totals 2 x its queue score plus 3 x its prefix score, formed as the Picker's C ranking forms them
    (0 + 2 x queue, then + 3 x prefix where the index holds some of the prompt), the best within its tie
    tolerance drawn in row order from the same random stream, over the same prefix index. The index's
    match and the ranking run in C where it can be built (csrc/prefix_load.c: one call where numpy made
    two dozen, the same operations in the same order), else in numpy. tests/sim/test_prefix_load.py
    holds both to the Picker's node on every pick, over a churning fleet and a simulated run, and
    tests/sim/test_llm_d_prefix.py the compiled match to the index's own."""

    def __init__(
        self, seed: int, server_blocks: Callable[[str], int] | None = None, compiled: bool = True
    ) -> None:
        """compiled: rank in C where it can be built (sim/prefix_load_native.py); False: numpy."""
        self._tie_break = TieBreak(np.random.default_rng([seed, 22]))
        self._index = LlmDPrefixIndex(server_blocks)
        self._candidates = _Candidates()
        self._compiled = (
            PrefixLoadRanking.create(
                _PREFIX_LOAD_WEIGHTS["queue"], _PREFIX_LOAD_WEIGHTS["prefix_affinity"], TIE_TOLERANCE
            )
            if compiled
            else None
        )

    def __call__(self, state: ClusterState, query: PickQuery) -> Choice | None:
        snapshot = state.snapshot
        if snapshot.num_rows == 0 or query.model not in snapshot.models:
            return None
        excluded = [r for r in map(snapshot.row_of.get, query.exclude) if r is not None]
        if self._compiled is not None:
            return self._ranked(state, query, excluded)
        rows = self._candidates(state, query)
        if excluded:
            rows = rows[~np.isin(rows, excluded)]
        if not rows.size:
            return None
        # Every row's total, then the candidates': indexing the prefix rows into a whole column is
        # cheaper than finding them among the candidates.
        waiting = snapshot.column("waiting")
        low, high = float(waiting.min(initial=0.0)), float(waiting.max(initial=0.0))
        queue = _PREFIX_LOAD_WEIGHTS["queue"]
        if high == low:
            totals = np.full(waiting.size, 1.0 * queue)
        else:
            totals = (high - waiting) / (high - low) * queue
        prefix_rows, held, total = self._index.match(snapshot, query)
        if prefix_rows.size:
            totals[prefix_rows] += held / total * _PREFIX_LOAD_WEIGHTS["prefix_affinity"]
        totals = totals[rows]
        ties = rows[totals >= totals.max() - TIE_TOLERANCE]
        row = int(ties[self._tie_break.draw(ties.size)] if ties.size > 1 else ties[0])
        node_id = snapshot.node_ids[row]
        assert node_id is not None  # a candidate is a live row
        self._index.add(query, node_id)
        chosen = held[prefix_rows == row]
        return Choice(node_id, int(chosen[0]) * BLOCK_TOKENS if chosen.size else 0)

    def _ranked(self, state: ClusterState, query: PickQuery, excluded: list[int]) -> Choice | None:
        """The same decision as the numpy ranking above, the index matched and the rows ranked by one
        compiled call."""
        assert self._compiled is not None
        snapshot = state.snapshot
        passed = self._candidates.passed(state, query)
        total, chain = self._index.chain(snapshot, query)
        row, drew, blocks = self._compiled.rank(
            snapshot.waiting, passed, snapshot.num_rows, excluded, total, chain,
            self._tie_break.next_uniform(),
        )  # fmt: skip
        if drew:
            self._tie_break.take()
        if row < 0:
            return None
        node_id = snapshot.node_ids[row]
        assert node_id is not None  # a candidate is a live row
        self._index.add(query, node_id)
        return Choice(node_id, blocks * BLOCK_TOKENS)


def _choice(snapshot: ClusterSnapshot, row: int) -> Choice:
    """The node at a candidate row, chosen by a policy without a prefix memo."""
    node_id = snapshot.node_ids[row]
    assert node_id is not None  # a candidate is a live row
    return Choice(node_id)


def prefix_load(
    seed: int, server_blocks: Callable[[str], int] | None = None, compiled: bool = True
) -> Policy:
    """server_blocks: each server's KV blocks, llm-d's auto-tuned index capacity (LlmDPrefixIndex);
    compiled: False ranks in numpy (the same decisions)."""
    return _PrefixLoad(seed, server_blocks, compiled)


def random_choice(seed: int) -> Policy:
    rng = np.random.default_rng([seed, 23])
    _candidates = _Candidates()

    def choose(state: ClusterState, query: PickQuery) -> Choice | None:
        rows = _candidates(state, query)
        return _choice(state.snapshot, int(rows[rng.integers(rows.size)])) if rows.size else None

    return choose


def round_robin(seed: int) -> Policy:
    turns: dict[str, int] = {}
    _candidates = _Candidates()

    def choose(state: ClusterState, query: PickQuery) -> Choice | None:
        rows = _candidates(state, query)
        if not rows.size:
            return None
        turn = turns.get(query.model, 0)
        turns[query.model] = turn + 1
        return _choice(state.snapshot, int(rows[turn % rows.size]))

    return choose


def power_of_two(seed: int) -> Policy:
    rng = np.random.default_rng([seed, 24])
    _candidates = _Candidates()

    def choose(state: ClusterState, query: PickQuery) -> Choice | None:
        rows = _candidates(state, query)
        if not rows.size:
            return None
        a, b = (int(r) for r in rows[rng.integers(rows.size, size=2)])
        s = state.snapshot
        a_load, b_load = s.running[a] + s.waiting[a], s.running[b] + s.waiting[b]
        return _choice(s, a if a_load <= b_load else b)

    return choose


# Run only when asked for (python -m sim --policies): built by the simulation from its config.
EXPERIMENTS = ("ours_reserve", "ours_no_prefix_cost")  # sim/latency_reserve.py; ours without its rule

POLICIES: dict[str, Callable[[int], Policy]] = {
    "random": random_choice,
    "round_robin": round_robin,
    "least_loaded": least_loaded,
    "power_of_two": power_of_two,
    "prefix_load": prefix_load,
    "ours": ours,
}
