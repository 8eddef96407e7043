"""Replica placement: from per-model demand, which models should be resident on which nodes.

Pure planning over a snapshot; the placer's planning loop (one leader at a time) feeds it demand from
Redis and publishes the result, and heartbeat replies turn it into load / evict requests per worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from services.placer.cluster.snapshot import ClusterSnapshot


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
    snapshot: ClusterSnapshot, rates_rps: dict[str, float], capacity_rps: float, now_s: float
) -> PlacementPlan:
    """Models each healthy node should hold: its resident models, plus replicas where demand outgrows them.

    Growing a model picks, in order: nodes with a host copy (fast load), then the most free GPU memory,
    then the least load; a node is only chosen if the weights fit in its free memory. Extra replicas
    beyond twice the need are released from the most loaded nodes (hysteresis: no flapping near the edge).
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
    for model, rate in sorted(rates_rps.items(), key=lambda kv: -kv[1]):
        columns = snapshot.model_columns(model)
        if columns is None:
            continue  # no worker can describe the model's size yet
        resident = rows[columns.resident[rows]]
        fits = rows[(~columns.resident[rows]) & (free[rows] >= columns.weight_bytes)]
        want = desired_replicas(rate, capacity_rps, len(resident) + len(fits))
        if len(resident) < want:
            order = np.lexsort((load[fits], -free[fits], ~columns.host_copy[fits]))
            for row in fits[order][: want - len(resident)]:
                node_id = snapshot.node_ids[row]
                assert node_id is not None
                plan[node_id].add(model)
                changed.add(node_id)
                free[row] -= columns.weight_bytes
        elif len(resident) > 2 * max(want, 1):
            for row in resident[np.argsort(-load[resident])][: len(resident) - max(want, 1)]:
                node_id = snapshot.node_ids[row]
                assert node_id is not None
                plan[node_id].discard(model)
                changed.add(node_id)
    return PlacementPlan(plan, changed)


def directives(desired: set[str] | None, resident: set[str]) -> tuple[list[str], list[str]]:
    """(models to load, models to evict) that move a node from resident to desired; nothing if None."""
    if desired is None:
        return [], []
    return sorted(desired - resident), sorted(resident - desired)
