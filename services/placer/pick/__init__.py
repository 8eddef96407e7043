"""Pick: filter -> score -> pick over one ClusterSnapshot, in the style of the Gateway API Inference
Extension endpoint picker. Pure and synchronous: no Redis, no gRPC, no awaits."""

from services.placer.pick.filters import DEFAULT_FILTERS, Filter, FilterConfig, build_filters
from services.placer.pick.framework import Candidate, Picker, PickResult
from services.placer.pick.query import PickContext, PickQuery
from services.placer.pick.scorers import DEFAULT_SCORERS, Scorer, ScorerConfig, build_scorers
from services.placer.pick.weights import DEFAULT_WEIGHTS, ClassWeights

__all__ = [
    "DEFAULT_FILTERS",
    "DEFAULT_SCORERS",
    "DEFAULT_WEIGHTS",
    "Candidate",
    "ClassWeights",
    "Filter",
    "FilterConfig",
    "PickContext",
    "PickQuery",
    "PickResult",
    "Picker",
    "Scorer",
    "ScorerConfig",
    "build_filters",
    "build_scorers",
]
