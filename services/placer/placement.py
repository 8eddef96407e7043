"""Replica placement: from per-model demand, which models should be resident on which nodes.

Pure planning over a snapshot; the placer's planning loop (one leader at a time) feeds it demand from
Redis and publishes the result, and heartbeat replies turn it into load / evict requests per worker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from services.placer.cluster.snapshot import ClusterSnapshot, ModelColumns


def desired_replicas(rate_rps: float, capacity_rps: float, eligible: int) -> int:
    """ceil(rate / per-replica capacity), at least 1 for a model with any demand, at most `eligible`."""
    if rate_rps <= 0 or eligible == 0:
        return 0
    return max(1, min(eligible, math.ceil(rate_rps / capacity_rps)))


@dataclass
class PlacementPlan:
    """desired: models each healthy node should hold; changed: the nodes where that differs from what
    they hold now (the only ones a worker needs to hear about)."""

    desired: dict[str, set[str]]
    changed: set[str]


def plan_replicas(
    snapshot: ClusterSnapshot,
    rates_rps: dict[str, float],
    capacity_rps: float,
    now_s: float,
    model_capacity_rps: Mapping[str, float] | None = None,
) -> PlacementPlan:
    """Models each healthy node should hold: its resident models, plus replicas where demand outgrows them.

    capacity_rps: requests per second one replica serves; model_capacity_rps overrides it per model (a
    70B decoder serves a few requests a second on a GPU where an embedding model serves hundreds, so one
    figure for every model sizes most of them wrong).

    A model wants ceil(demand / capacity) replicas, at most as many as nodes list it (their catalog: a
    worker loads only from its own). Growing it picks, in order: nodes with a host copy (fast load),
    then the most free GPU memory, then the least load, among those with room for its weights. A replica
    is released only to make that room: where a growing model is still short, the nodes that list it
    and hold surplus replicas of other models (more than twice those models' need: hysteresis, so
    nothing flaps near the edge) give them up, host copies and least loaded first, where that frees
    enough. A replica whose memory nobody needs stays: evicting it would free nothing anyone uses, and
    the next request routed to its host copy would load it back.
    """
    healthy = snapshot.column("live") & (snapshot.column("deadline_s") > now_s) & ~snapshot.column("draining")
    rows = np.flatnonzero(healthy)
    plan: dict[str, set[str]] = {}
    changed: set[str] = set()
    for row in rows:
        node_id = snapshot.node_ids[row]
        assert node_id is not None
        plan[node_id] = {m for m, c in snapshot.models.items() if c.resident[row]}
    free = snapshot.column("memory_free_bytes").copy()
    load = snapshot.column("running") + snapshot.column("waiting")
    wanted: list[tuple[str, int, ModelColumns]] = []
    surplus: dict[str, int] = {}  # replicas of each model that may make room for another
    for model, rate in sorted(rates_rps.items(), key=lambda kv: -kv[1]):
        columns = snapshot.model_columns(model)
        if columns is None:
            continue  # no worker can describe the model's size yet
        held = int(columns.resident[rows].sum())
        capacity = (model_capacity_rps or {}).get(model, capacity_rps)
        want = desired_replicas(rate, capacity, int(columns.listed[rows].sum()))
        if held > 2 * max(want, 1):
            surplus[model] = held - max(want, 1)
        wanted.append((model, want - held, columns))
    for model, short, columns in wanted:
        if short <= 0:
            continue
        weight = columns.weight_bytes
        open_rows = rows[columns.listed[rows] & ~columns.resident[rows]]
        fits = open_rows[free[open_rows] >= weight]
        chosen = list(fits[np.lexsort((load[fits], -free[fits], ~columns.host_copy[fits]))][:short])
        tight = open_rows[free[open_rows] < weight]
        for row in tight[np.lexsort((load[tight], ~columns.host_copy[tight]))]:
            if len(chosen) >= short:
                break
            node_id = snapshot.node_ids[row]
            assert node_id is not None
            released, room = [], float(free[row])
            for other in sorted(m for m in plan[node_id] if surplus.get(m, 0) > 0):
                if room >= weight:
                    break
                released.append(other)
                room += snapshot.models[other].weight_bytes
            if room < weight:
                continue
            for other in released:
                plan[node_id].discard(other)
                surplus[other] -= 1
            free[row] = room
            chosen.append(row)
        for row in chosen:
            node_id = snapshot.node_ids[row]
            assert node_id is not None
            plan[node_id].add(model)
            changed.add(node_id)
            free[row] -= weight
    return PlacementPlan(plan, changed)


def directives(desired: set[str] | None, resident: set[str]) -> tuple[list[str], list[str]]:
    """(models to load, models to evict) that move a node from resident to desired; nothing if None."""
    if desired is None:
        return [], []
    return sorted(desired - resident), sorted(resident - desired)
