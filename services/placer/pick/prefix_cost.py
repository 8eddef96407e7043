"""The prefix cost rule: keep a latency request on the node that holds its prompt's prefix when missing
that prefix would cost more prefill than the queue it avoids.

The scorers rank nodes by heat, load and where a prefix is; a sum of scores cannot say that a follow-up
agent call with 3,900 tokens of history cached on one worker should wait behind that worker's queue
rather than compute all of them again on an idle one. On the local mesh the placer did exactly that
(the fidelity runs, docs/simulator.md): 12-18 s of prefill where the queue it avoided was a second or
two. So after ranking, the Picker compares the two in one unit, prompt tokens to compute before this
request's first token, each node's divided by its clock (a throttled GPU computes them slower):

    cost(node) = (latency_prompt_tokens(node) + prompt - cached(node)) / clock(node)

where latency_prompt_tokens is the latency classes' prefill the node has queued or in flight (the
heartbeat's figure, plus the placer's own picks since), cached is the remembered prefix's length on the
prefix node and 0 elsewhere, and clock is sm_clock / sm_clock_max where a GPU sample says so. The
prefix node wins when its cost is no higher than the ranked winner's. Decode rows are left out (a step
computes a few of them beside thousands of prompt tokens), as is prefix reuse on other nodes (the memo
knows only where a prefix was last sent).

The comparison is of prefill alone, so it cannot see what piling a node's sessions onto it costs their
tokens after the first: every kept call's prompt chunks stall that node's decodes, and on the fleet
simulation a rule free to keep every later agent call home (9,684 of them in 10 minutes) cost agent
attainment 0.93 -> 0.84, nearly all in time per token (docs/simulator.md). So, as SGLang's cache-aware
router does, the prefix is not followed where the load is out of balance: when the prefix node holds
more than PrefixBalance.requests requests more than the ranked winner and more than PrefixBalance.ratio
times its requests (SGLang's defaults, balance_abs_threshold 32 and balance_rel_threshold 1.0001), the
ranked winner serves. Requests count running and queued, as SGLang's do: queued batch is served after the
latency classes, but it takes the seats they free and decodes beside them.

Batch is left to the scorers: its prefix score already fades with the node's queue, and what it is
measured by is throughput, not a first token.
"""

from __future__ import annotations

from typing import NamedTuple

from services.common.workload import WorkloadClass
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick.query import PickContext, PickQuery
from services.placer.pick.table import RowTable

# The classes whose requests the rule keeps with their prefix: those waiting on a first token.
PREFIX_COST_CLASSES = frozenset(
    {WorkloadClass.REALTIME_CHAT, WorkloadClass.AGENT_TOOL, WorkloadClass.UNSPECIFIED}
)


class PrefixBalance(NamedTuple):
    """Where the prefix node is out of balance and its prefix not followed: it holds more than requests
    requests more than the ranked winner, and more than ratio times its requests. The defaults are
    SGLang router's (balance_abs_threshold, balance_rel_threshold); HANZO_PLACER_PREFIX_BALANCE_REQUESTS
    and _RATIO set them for the placer, HANZO_GATEWAY_PREFIX_BALANCE_* for a gateway's embedded replica."""

    requests: float = 32.0
    ratio: float = 1.0001


DEFAULT_PREFIX_BALANCE = PrefixBalance()


# Classes whose prompts the worker's latency prefill leaves out (Scheduler.latency_prompt_tokens): batch,
# served behind the others, and embeddings, which its decoders' schedulers never see.
_NOT_LATENCY_PREFILL = frozenset({WorkloadClass.BATCH, WorkloadClass.EMBEDDING})


def latency_tokens_of(query: PickQuery, cached_tokens: int = 0) -> int:
    """Prompt tokens a pick of query adds to its node's latency prefill until the node's next heartbeat,
    counted as the worker counts a queued sequence: the prompt less the cached_tokens of its prefix the
    node holds (PickResult.cached_tokens), and 0 for a class the worker leaves out. Whatever classes a
    Picker's rule serves, the figure it is added to is the worker's."""
    if query.workload_class in _NOT_LATENCY_PREFILL:
        return 0
    return max(query.prompt_estimate() - cached_tokens, 0)


def prefill_cost(snapshot: ClusterSnapshot, row: int, uncached_tokens: int) -> float:
    """Prompt tokens the node at row computes before a new latency request's first token, at full clock:
    its latency prefill pending plus the request's uncached tokens, over its clock fraction."""
    pending = float(snapshot.latency_prompt_tokens[row]) + uncached_tokens
    clock_max = snapshot.sm_clock_max_mhz[row]
    if snapshot.has_thermal[row] and clock_max > 0:
        # A GPU sampled at clock 0 is stalled, not free: floor the fraction so its cost stays finite.
        pending /= max(float(snapshot.sm_clock_mhz[row] / clock_max), 0.05)
    return pending


def keep_prefix(
    snapshot: ClusterSnapshot,
    query: PickQuery,
    context: PickContext,
    chosen: int,
    table: RowTable,
    excluded_rows: list[int],
    balance: PrefixBalance = DEFAULT_PREFIX_BALANCE,
) -> bool:
    """Whether the prefix node (context.prefix_row) should serve query, of a class the rule serves,
    instead of the ranked winner chosen: only a node that passed table's filters, is not excluded and
    is no more a last resort than chosen is considered."""
    prefix_row = context.prefix_row
    if (
        prefix_row is None
        or prefix_row == chosen
        or not table.passed[prefix_row]
        or prefix_row in excluded_rows
        or table.degraded[prefix_row] > table.degraded[chosen]
    ):
        return False
    model = snapshot.models.get(query.model)
    if model is None or not model.resident[prefix_row]:
        return False  # evicted since: its KV went with it
    if out_of_balance(snapshot, prefix_row, chosen, balance):
        return False
    prompt = max(query.prompt_estimate(), context.prefix_tokens)
    kept = prefill_cost(snapshot, prefix_row, prompt - context.prefix_tokens)
    return kept <= prefill_cost(snapshot, chosen, prompt)


def out_of_balance(
    snapshot: ClusterSnapshot, prefix_row: int, chosen: int, balance: PrefixBalance = DEFAULT_PREFIX_BALANCE
) -> bool:
    """Whether the prefix node holds so many more requests (running and queued) than the ranked winner
    that following the prefix would pile work onto it."""
    held = float(snapshot.running[prefix_row] + snapshot.waiting[prefix_row])
    winner = float(snapshot.running[chosen] + snapshot.waiting[chosen])
    return held - winner > balance.requests and held > balance.ratio * winner
