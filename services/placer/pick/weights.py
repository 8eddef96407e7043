"""Scorer weights per workload class, with documented defaults and validated overrides from config.

A node's total is sum(weight * score) over the class's scorers, so it lies in [0, sum of weights]; weights
need not add up to 1, only their ratios matter. A weight of 0 turns a scorer off for that class.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from services.common.workload import WorkloadClass
from services.placer.pick.scorers import DEFAULT_SCORERS

# Latency classes weigh heat and load most: a throttling or busy GPU stretches time to first token.
_LATENCY = {
    "thermal_headroom": 0.3,
    "load": 0.3,
    "model_affinity": 0.2,
    "prefix_affinity": 0.1,
    "topology": 0.1,
}

# batch_isolation (scorers.py) is off by default: on the fleet simulator's 96 GPUs it raised chat SLO
# attainment under severe cooling imbalance (0.872 -> 0.883, agent 0.825 -> 0.879, batch throughput
# -0.6%) but lowered it with uniform cooling (0.585 -> 0.279) and mild imbalance (0.818 -> 0.719), at
# 0.23 of the latency classes' and batch's weights; docs/simulator.md, "Not yet done".
DEFAULT_WEIGHTS: Mapping[WorkloadClass, Mapping[str, float]] = MappingProxyType(
    {
        WorkloadClass.REALTIME_CHAT: MappingProxyType(dict(_LATENCY)),
        WorkloadClass.AGENT_TOOL: MappingProxyType(dict(_LATENCY)),
        # Unclassified requests are treated like agent steps: latency matters, but we do not know how much.
        WorkloadClass.UNSPECIFIED: MappingProxyType(dict(_LATENCY)),
        # Small encoder requests: spread by load; no long prompt prefix to reuse.
        WorkloadClass.EMBEDDING: MappingProxyType(
            {"load": 0.4, "model_affinity": 0.3, "thermal_headroom": 0.2, "topology": 0.1}
        ),
        # Batch has no latency SLO, but it is the heat: long prompts run a GPU at its power cap. Placed by
        # thermal headroom first, it keeps badly cooled GPUs out of slowdown, and the latency classes
        # find cool GPUs (the fleet simulator, severe cooling imbalance: no throttle episodes instead of
        # 13 with thermal at 0.05 of 1.0, chat SLO attainment 0.68 -> 0.87, batch throughput the same).
        # Heat 0.42 and load 0.21 (0.4 and 0.16 before, the rest scaled to keep the sum 1): spread a little
        # wider by load, batch fills more of what the cool GPUs leave. The full fleet run, 30 minutes,
        # against llm-d's prefix + load (the best at batch): 334,326 -> 344,324 output tok/s, 0.935 ->
        # 0.963 of its; chat attainment 0.832 -> 0.793, agent 0.942 -> 0.914; still no throttle episodes
        # (docs/simulator.md, item 8). Heat stays twice load, so a GPU in thermal slowdown still gets no
        # batch over a busy node (tests/placer/pick/test_picker.py); more load bought more batch for chat
        # (load 0.28 at heat 0.4: chat 0.706; 0.56: chat 0.02).
        WorkloadClass.BATCH: MappingProxyType(
            {
                "thermal_headroom": 0.42,
                "model_affinity": 0.185,
                "prefix_affinity": 0.135,
                "load": 0.21,
                "topology": 0.05,
            }
        ),
    }
)


@dataclass(frozen=True)
class ClassWeights:
    """Scorer name -> weight, per workload class. Build with defaults() or from_config()."""

    by_class: Mapping[WorkloadClass, Mapping[str, float]]

    @classmethod
    def defaults(cls) -> ClassWeights:
        """The documented DEFAULT_WEIGHTS."""
        return cls(DEFAULT_WEIGHTS)

    @classmethod
    def from_config(
        cls,
        overrides: Mapping[str, Mapping[str, float]] | None,
        scorer_names: Iterable[str] = DEFAULT_SCORERS.keys(),
    ) -> ClassWeights:
        """Defaults with overrides applied per scorer, e.g. {"BATCH": {"thermal_headroom": 0.0}}.

        Keys are WorkloadClass names (any case). Raises ValueError naming the culprit for an unknown
        class, an unknown scorer name, or a weight that is negative or not a finite number.
        """
        known = frozenset(scorer_names)
        merged = {wc: dict(weights) for wc, weights in DEFAULT_WEIGHTS.items()}
        for class_name, weights in (overrides or {}).items():
            workload_class = _workload_class(class_name)
            for name, weight in weights.items():
                merged[workload_class][name] = _checked_weight(workload_class, name, weight, known)
        return cls(MappingProxyType({wc: MappingProxyType(w) for wc, w in merged.items()}))

    def for_class(self, workload_class: WorkloadClass) -> Mapping[str, float]:
        """The weights of one class; an empty mapping for a class with none configured."""
        return self.by_class.get(workload_class, MappingProxyType({}))


def _workload_class(name: str) -> WorkloadClass:
    try:
        return WorkloadClass[name.upper()]
    except KeyError:
        choices = ", ".join(wc.name for wc in WorkloadClass)
        raise ValueError(f"unknown workload class {name!r} in weights (one of {choices})") from None


def _checked_weight(workload_class: WorkloadClass, name: str, weight: object, known: frozenset[str]) -> float:
    """weight as a float; ValueError naming the scorer if it is unknown, not a finite number, or negative."""
    where = f"weight of {name!r} for {workload_class.name}"
    if name not in known:
        raise ValueError(
            f"unknown scorer {name!r} in weights for {workload_class.name} (known: {sorted(known)})"
        )
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
        raise ValueError(f"{where} is not a finite number: {weight!r}")
    if weight < 0:
        raise ValueError(f"{where} is negative: {weight}")
    return float(weight)
