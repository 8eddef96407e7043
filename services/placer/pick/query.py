"""What one pick is asked (PickQuery) and what the framework resolves for it before scoring (PickContext)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.workload import WorkloadClass

MAX_PREFIX_CHAIN = 64  # elements of a prompt's prefix chain a pick reads at most
# Prompt tokens an element of the gateway's chain covers where the request does not say (its token-id
# prompts' block; text blocks are 512 characters, about as many tokens).
TOKENS_PER_ELEMENT = 128


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
    # Where each prefix_chain element ends in the prompt, in tokens (an estimate for text): as many as the
    # chain, or () for TOKENS_PER_ELEMENT an element.
    prefix_chain_tokens: tuple[int, ...] = ()
    prompt_tokens: int = 0  # estimate; 0 when unknown
    exclude: frozenset[str] = field(default_factory=frozenset)  # node ids never to pick
    now_s: float = 0.0  # Unix time of the decision, passed in so decisions are reproducible
    explain_top: int = 3  # runners-up to explain besides the chosen node; 0: only the chosen one

    def prefix_tokens(self, elements: int) -> int:
        """Prompt tokens covered by the chain's first `elements` elements (0 for none)."""
        if elements <= 0:
            return 0
        if self.prefix_chain_tokens:
            return self.prefix_chain_tokens[min(elements, len(self.prefix_chain_tokens)) - 1]
        return elements * TOKENS_PER_ELEMENT

    def prompt_estimate(self) -> int:
        """The prompt's length in tokens: prompt_tokens where given, else where its chain ends."""
        return self.prompt_tokens or self.prefix_tokens(len(self.prefix_chain))


@dataclass(frozen=True)
class PickContext:
    """Facts the framework looks up once per decision and hands to every scorer, so scorers stay pure."""

    # Snapshot row of the node that last served the longest remembered prefix of the prompt; None if none.
    prefix_row: int | None = None
    # Prompt tokens of that prefix (query.prefix_tokens of the elements matched); 0 with no prefix_row.
    prefix_tokens: int = 0


NO_CONTEXT = PickContext()
