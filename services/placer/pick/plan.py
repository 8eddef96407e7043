"""Which scorers a pick runs for one workload class, resolved once from the weights: row scorers kept in
the RowTable, request scorers run per pick."""

from __future__ import annotations

from typing import NamedTuple

from services.common.workload import WorkloadClass
from services.placer.pick.scorers import RequestScorer, RowScorer, Scorer
from services.placer.pick.weights import ClassWeights


class Plan(NamedTuple):
    """One class's scorers with a nonzero weight, resolved once: names in weight order, the row scorers
    (kept in the RowTable) and the request scorers (run per pick) with their weights, and the row
    scorers' names alone."""

    names: list[str]
    row: list[tuple[str, RowScorer, float]]
    request: list[tuple[str, RequestScorer, float]]
    weight_sum: float
    row_names: list[str]


def plan_of(weights: ClassWeights, scorers: dict[str, Scorer], workload_class: WorkloadClass) -> Plan:
    """workload_class's Plan; ValueError for a weight naming a scorer not in scorers, or a negative one."""
    names: list[str] = []
    row: list[tuple[str, RowScorer, float]] = []
    request: list[tuple[str, RequestScorer, float]] = []
    for name, weight in weights.for_class(workload_class).items():
        if name not in scorers:
            raise ValueError(f"weights for {workload_class.name} name unknown scorer {name!r}")
        if not weight >= 0:
            raise ValueError(f"weight of {name!r} for {workload_class.name} is negative: {weight}")
        if weight > 0:
            scorer = scorers[name]
            names.append(name)
            if isinstance(scorer, RequestScorer):
                request.append((name, scorer, float(weight)))
            else:
                row.append((name, scorer, float(weight)))
    weight_sum = sum(w for _, _, w in row) + sum(w for _, _, w in request)
    return Plan(names, row, request, weight_sum, [name for name, _, _ in row])
