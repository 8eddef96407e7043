"""An experiment, not (yet) the placer's code: ours with a latency reserve, to measure what keeping some
GPUs free of batch buys the latency classes and costs batch (docs/simulator.md, "Chat against batch").

Why: on the comparison's fleet, batch fills every GPU it reaches, and a chat reply decoding beside a
batch prompt's prefill chunks (a third of a second each on the 70B) misses its 100 ms per token. The
reserve is a set of nodes of the batch model that batch is never routed to while any other node can take
it; the latency classes (chat, agent, unclassified) score reserved nodes higher (a request scorer at
RESERVE_WEIGHT beside ours' weights). Every RESIZE_S the reserve is resized from the heartbeats alone, as
a placer could: when its nodes average more than SEATS latency requests (running + waiting - batch), it
grows by that excess, taking the nodes with the least batch work; below 0.7 x SEATS it gives back a
twentieth, the nodes with the least latency work. Conversations and agent tenants are kept on the
nodes holding their history (latency prefix affinity 0.5 instead of 0.1; --weights overrides it): on a
reserve, an uncached history, not batch, is what misses the time to first token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from services.common.workload import WorkloadClass
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.cluster.state import ClusterState
from services.placer.pick.framework import Picker
from services.placer.pick.query import PickContext, PickQuery
from services.placer.pick.scorers import DEFAULT_SCORERS, RequestScorer
from services.placer.pick.weights import ClassWeights
from sim.policies import Choice, Policy

RESIZE_S = 5.0  # the placer's planning interval
START_SHARE = 0.05  # of the model's nodes, reserved before any heartbeat says how much is needed
RESERVE_WEIGHT = 0.5
LATENCY_CLASSES = (WorkloadClass.REALTIME_CHAT, WorkloadClass.AGENT_TOOL, WorkloadClass.UNSPECIFIED)
_LATENCY_PREFIX_AFFINITY = 0.5
_GROW_ABOVE, _SHRINK_BELOW = 1.15, 0.7  # x SEATS: the band where the reserve keeps its size


class LatencyReserve:
    """The reserved nodes of one model (ids and snapshot rows), resized by update()."""

    def __init__(self, model: str, seats: float, ids: frozenset[str] | None = None) -> None:
        """ids: the nodes reserved from the start; None: START_SHARE of the model's nodes, those with the
        least batch work, at the first update."""
        self.model = model
        self.seats = seats
        self.ids: frozenset[str] = ids or frozenset()
        self.rows = np.zeros(0, dtype=np.int64)
        self.started = ids is not None
        self.sizes: list[int] = []  # after each resize
        self._next_s = 0.0

    def update(self, snapshot: ClusterSnapshot, now_s: float) -> None:
        """Resize when RESIZE_S has passed since the last resize."""
        if now_s < self._next_s:
            return
        self._next_s = now_s + RESIZE_S
        columns = snapshot.models.get(self.model)
        if columns is None:
            return
        n = snapshot.num_rows
        live = snapshot.column("live") & (snapshot.column("deadline_s") > now_s)
        serving = np.flatnonzero(live & columns.resident[:n])
        batch = snapshot.column("batch_running") + snapshot.column("batch_waiting")
        latency = snapshot.column("running") + snapshot.column("waiting") - batch
        ids = set(self.ids)
        if not self.started:
            self.started = True
            ids = _ids(snapshot, _least(serving, batch, max(1, int(serving.size * START_SHARE))))
        rows = _rows(snapshot, ids)
        rows = rows[live[rows]] if rows.size else rows
        mean = float(latency[rows].mean()) if rows.size else math.inf
        if mean > self.seats * _GROW_ABOVE:
            grow = max(1, math.ceil(rows.size * (mean / self.seats - 1))) if rows.size else 1
            ids |= _ids(snapshot, _least(np.setdiff1d(serving, rows), batch, grow))
        elif mean < self.seats * _SHRINK_BELOW and rows.size > 1:
            ids -= _ids(snapshot, _least(rows, latency, max(1, rows.size // 20)))
        self.ids = frozenset(ids)
        self.rows = _rows(snapshot, ids)
        self.sizes.append(int(self.rows.size))

    def summary(self) -> dict[str, object]:
        sizes = self.sizes or [0]
        return {"model": self.model, "seats": self.seats, "nodes_last": sizes[-1], "nodes_max": max(sizes),
                "nodes_each_minute": sizes[:: int(60 / RESIZE_S)]}  # fmt: skip

    def score(
        self, snapshot: ClusterSnapshot, query: PickQuery, context: PickContext, out: np.ndarray
    ) -> np.ndarray:
        """The request scorer: 1 on a reserved node."""
        rows = self.rows[self.rows < snapshot.num_rows]
        out[rows] = 1.0
        return rows


def _least(rows: np.ndarray, key: np.ndarray, count: int) -> np.ndarray:
    return rows[np.argsort(key[rows], kind="stable")[:count]]


def _rows(snapshot: ClusterSnapshot, ids: set[str]) -> np.ndarray:
    """The snapshot rows of ids (those it holds), in row order."""
    return np.array(sorted(snapshot.row_of[i] for i in ids if i in snapshot.row_of), dtype=np.int64)


def _ids(snapshot: ClusterSnapshot, rows: np.ndarray) -> set[str]:
    return {str(snapshot.node_ids[r]) for r in rows.tolist()}


def reserve_weights(class_weights: Mapping[str, Mapping[str, float]]) -> ClassWeights:
    """Ours' weights with class_weights' overrides (as --weights gives them), the latency classes'
    prefix affinity at 0.5 unless overridden, and the reserve's scorer at RESERVE_WEIGHT for them."""
    overrides = {name.upper(): dict(weights) for name, weights in class_weights.items()}
    for wc in LATENCY_CLASSES:
        given = overrides.get(wc.name, {})
        overrides[wc.name] = {"prefix_affinity": _LATENCY_PREFIX_AFFINITY, **given, "reserve": RESERVE_WEIGHT}
    return ClassWeights.from_config(overrides, [*DEFAULT_SCORERS, "reserve"])


def ours_reserve(seed: int, weights: ClassWeights, reserve: LatencyReserve) -> Policy:
    """The placer's Picker with weights (reserve_weights), the reserve's scorer, and batch for the
    reserve's model routed around the reserve unless nothing else can take it."""
    scorers = {**DEFAULT_SCORERS, "reserve": RequestScorer(reserve.score)}
    picker = Picker(weights, scorers=scorers, rng=np.random.default_rng([seed, 20]))

    def choose(state: ClusterState, query: PickQuery) -> Choice | None:
        reserve.update(state.snapshot, query.now_s)
        result = None
        if query.workload_class == WorkloadClass.BATCH and query.model == reserve.model and reserve.ids:
            result = picker.pick(state.snapshot, replace(query, exclude=query.exclude | reserve.ids))
        if result is None:
            result = picker.pick(state.snapshot, query)
        return None if result is None else Choice(result.node_id, result.cached_tokens)

    return choose
