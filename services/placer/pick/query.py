"""What one pick is asked (PickQuery) and what the framework resolves for it before scoring (PickContext)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.workload import WorkloadClass


@dataclass(frozen=True)
class PickQuery:
    """One request to place. Topology labels are "" when unknown."""

    model: str
    workload_class: WorkloadClass
    caller_zone: str = ""
    caller_rack: str = ""
    caller_host: str = ""
    prefix_hash: int | None = None  # hash of the prompt's leading tokens; None when unknown
    prompt_tokens: int = 0  # estimate; 0 when unknown
    exclude: frozenset[str] = field(default_factory=frozenset)  # node ids never to pick
    now_s: float = 0.0  # Unix time of the decision, passed in so decisions are reproducible
    explain_top: int = 3  # runners-up to explain besides the chosen node; 0: only the chosen one


@dataclass(frozen=True)
class PickContext:
    """Facts the framework looks up once per decision and hands to every scorer, so scorers stay pure."""

    prefix_row: int | None = None  # snapshot row that last served query.prefix_hash; None when unknown


NO_CONTEXT = PickContext()
