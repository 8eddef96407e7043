"""What one pick is asked (PickQuery) and what the framework resolves for it before scoring (PickContext)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.workload import WorkloadClass

MAX_PREFIX_CHAIN = 64  # elements of a prompt's prefix chain a pick reads at most


@dataclass(frozen=True)
class PickQuery:
    """One request to place. Topology labels are "" when unknown."""

    model: str
    workload_class: WorkloadClass
    caller_zone: str = ""
    caller_rack: str = ""
    caller_host: str = ""
    # The prompt's prefix chain (services/gateway/prefix_chain.py): element i hashes it from its start to
    # the end of its block i; () when unknown.
    prefix_chain: tuple[int, ...] = ()
    prompt_tokens: int = 0  # estimate; 0 when unknown
    exclude: frozenset[str] = field(default_factory=frozenset)  # node ids never to pick
    now_s: float = 0.0  # Unix time of the decision, passed in so decisions are reproducible
    explain_top: int = 3  # runners-up to explain besides the chosen node; 0: only the chosen one


@dataclass(frozen=True)
class PickContext:
    """Facts the framework looks up once per decision and hands to every scorer, so scorers stay pure."""

    # Snapshot row of the node that last served the longest remembered prefix of the prompt; None if none.
    prefix_row: int | None = None


NO_CONTEXT = PickContext()
