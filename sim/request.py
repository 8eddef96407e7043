"""One simulated request, from arrival to its last token."""

from __future__ import annotations

import math

from services.common.workload import WorkloadClass
from services.worker.engine.policy.classes import DEFAULT_CLASS_POLICIES

# The adaptive policy's order of waiting prompts (worker/engine/policy/classes.py): chat first, then
# the other latency classes, batch last.
PRIORITY = {
    WorkloadClass.REALTIME_CHAT: 0,
    WorkloadClass.AGENT_TOOL: 1,
    WorkloadClass.EMBEDDING: 1,
    WorkloadClass.UNSPECIFIED: 1,
    WorkloadClass.BATCH: 2,
}
# How long a request may wait at a worker for its first schedule before the worker refuses it
# (RESOURCE_EXHAUSTED) and the gateway moves it to another: the worker's defaults, inf for none.
QUEUE_TIMEOUT_S = {
    wc: math.inf if policy.queue_timeout_s is None else policy.queue_timeout_s
    for wc, policy in DEFAULT_CLASS_POLICIES.items()
}


class Request:
    """prompt: its tokens (history included); output: tokens it generates (0 for an embedding).
    conversation / tools: prefix-cache keys (the conversation's history, the tenant's shared tool or
    instruction prompt) with tools_tokens the shared part's length; prefix_chain: the prompt's prefix chain
    as the gateway would send it to the placer, one element per prefix the placer can tell apart (the
    tools, then the conversation's own history), not one per block; prefix_ends: where each element ends
    in the prompt, in tokens, as the gateway sends them (sim_prefix_ends)."""

    __slots__ = (
        "admit_no",
        "arrival_s",
        "attempts",
        "cached",
        "caller_zone",
        "conversation",
        "done_s",
        "excluded",
        "expires_s",
        "finish_counter",
        "first_token_s",
        "follow_up",
        "generated",
        "gpu",
        "id",
        "join_counter",
        "model",
        "output",
        "preemptions",
        "prefix_chain",
        "prefix_ends",
        "priority",
        "prompt",
        "queued_cached",
        "to_prefill",
        "tools",
        "tools_tokens",
        "workload",
    )

    def __init__(
        self,
        id: int,
        workload: WorkloadClass,
        model: str,
        arrival_s: float,
        prompt: int,
        output: int,
        conversation: int,
        tools: int,
        tools_tokens: int,
        prefix_chain: tuple[int, ...],
        caller_zone: str,
        follow_up: object = None,
        prefix_ends: tuple[int, ...] = (),
    ) -> None:
        self.id = id
        self.workload = workload
        self.priority = PRIORITY[workload]
        self.model = model
        self.arrival_s = arrival_s
        self.prompt = prompt
        self.output = output
        self.conversation = conversation
        self.tools = tools
        self.tools_tokens = tools_tokens
        self.prefix_chain = prefix_chain
        self.prefix_ends = prefix_ends
        self.caller_zone = caller_zone
        self.follow_up = follow_up  # what the workload does once this one completes (the next turn)
        self.gpu = -1
        self.cached = 0
        self.to_prefill = prompt
        self.first_token_s = -1.0
        self.done_s = -1.0
        self.finish_counter = 0.0
        # Where the engine has it (sim/engine_model.py): tokens streamed so far (a preempted request
        # recomputes its prompt and these, then streams the rest), its place in the running set's order,
        # the decode-step counter it started decoding at, and how often it was preempted.
        self.generated = 0
        self.admit_no = 0
        self.join_counter = 0.0
        self.preemptions = 0
        # Of its prompt (and what it streamed), the tokens its engine's prefix cache held when it last
        # joined the queue: what the worker's heartbeat leaves out of a queued latency prompt.
        self.queued_cached = 0
        # The gateway's side: workers picked so far, those that failed it (excluded from the next pick),
        # and when the worker now holding it refuses it if it was never scheduled (queue timeout).
        self.attempts = 0
        self.excluded: frozenset[str] = frozenset()
        self.expires_s = math.inf


def sim_prefix_ends(chain: tuple[int, ...], shared_tokens: int, sent_before: int) -> tuple[int, ...]:
    """Where a simulated prefix chain's elements end, in tokens: a shared prefix (an agent tenant's tools,
    a batch job's instruction) at its length; the conversation's own element at what the placer was
    sent of it before (the previous turn's prompt: the gateway's chain of that prompt is what the memo
    remembers), or at the shared prefix on a first turn."""
    if len(chain) == 2:
        return shared_tokens, max(sent_before, shared_tokens)
    if len(chain) == 1:
        return (shared_tokens or sent_before,)
    return ()
