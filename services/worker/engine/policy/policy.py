"""The scheduling policies: ordering, admission limits and the step budget, behind one small protocol.

The scheduler owns blocks and the running set; it asks its policy every question of judgement: which
queue order, who outranks whom, how much KV an admission must leave, how long a request may wait, and
how many tokens this step may compute. FifoPolicy answers them as plain continuous batching does
(arrival order, nobody outranks anybody, a fixed budget): the baseline. AdaptivePolicy answers them
from the workload classes, their service levels and the tenants' fair shares.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from services.common.workload import WorkloadClass
from services.worker.engine.errors import AdmissionError
from services.worker.engine.policy.budget import BudgetController
from services.worker.engine.policy.classes import ClassPolicy, PolicyConfig, PolicyName
from services.worker.engine.policy.tenants import TenantLedger
from services.worker.engine.policy.waiting import FifoQueue, PriorityQueue, WaitingQueue
from services.worker.engine.sequence import Sequence

_RATE_EWMA = 0.1
_MIN_RETRY_S = 0.05
_MAX_RETRY_S = 60.0


class SchedulingPolicy(Protocol):
    """What the scheduler asks of its policy."""

    config: PolicyConfig
    budget: BudgetController

    @property
    def preempts_between_layers(self) -> bool:
        """True when latency-class prompts may run between the layers of a step already executing."""
        ...

    def new_queue(self) -> WaitingQueue: ...
    def priority_of(self, seq: Sequence) -> int: ...
    def running_key(self, seq: Sequence) -> tuple[int, int]: ...
    def outranks(self, a: Sequence, b: Sequence) -> bool: ...
    def is_latency(self, seq: Sequence) -> bool: ...
    def charge(self, seq: Sequence, tokens: int) -> None: ...
    def reserve_fraction(self, seq: Sequence) -> float: ...
    def reserved_seats(self, seq: Sequence, max_num_seqs: int) -> int: ...
    def tokens_to_hold(self, seq: Sequence) -> int: ...
    def check_queue_room(
        self, seq: Sequence, waiting: int, waiting_in_class: int, tokens_ahead: int
    ) -> None: ...
    def queue_timeout(self, seq: Sequence) -> float | None: ...
    def retry_after(self, tokens_ahead: int) -> float: ...
    def observe_step(self, num_tokens: int, num_seqs: int, seconds: float) -> None: ...
    def choose_budget(self, now: float, running: Iterable[Sequence], waiting: WaitingQueue) -> int: ...


class _Measured:
    """What both policies share: the step-time model they learn from, the drain rate behind a refusal's
    retry delay, and the running set's order."""

    def __init__(self, config: PolicyConfig, max_num_batched_tokens: int) -> None:
        self.config = config
        low = min(config.min_batched_tokens, max_num_batched_tokens)
        self.budget = BudgetController(low, max_num_batched_tokens)
        self._tokens_per_s: float | None = None

    def class_of(self, seq: Sequence) -> ClassPolicy:
        return self.config.classes[seq.hints.workload]

    def running_key(self, seq: Sequence) -> tuple[int, int]:
        """Order of the running set: served first to last, preempted last to first."""
        return (seq.priority, seq.admit_no)

    def reserved_seats(self, seq: Sequence, max_num_seqs: int) -> int:
        """Seats of the running set seq's admission must leave free for latency classes: the same share
        as the KV reserve. A latency prompt arriving mid-step can only run nested in a free seat (nothing
        running is displaced while a step executes), so a full house of batch work would make it wait
        for the step's end."""
        return int(self.reserve_fraction(seq) * max_num_seqs)

    def reserve_fraction(self, seq: Sequence) -> float:
        return 0.0

    def check_queue_room(self, seq: Sequence, waiting: int, waiting_in_class: int, tokens_ahead: int) -> None:
        """AdmissionError when the queue already holds max_waiting requests (every class together)."""
        limit = self.config.max_waiting
        if limit is not None and waiting >= limit:
            raise self._full(f"the queue is full ({waiting} waiting, limit {limit})", tokens_ahead)

    def _full(self, why: str, tokens_ahead: int) -> AdmissionError:
        return AdmissionError(
            why, retry_after_s=self.retry_after(tokens_ahead), reason=AdmissionError.QUEUE_FULL
        )

    def retry_after(self, tokens_ahead: int) -> float:
        """Seconds until the engine has likely worked through tokens_ahead, from its measured rate."""
        rate = self._tokens_per_s
        if not rate:
            return 1.0
        return min(_MAX_RETRY_S, max(_MIN_RETRY_S, tokens_ahead / rate))

    def observe_step(self, num_tokens: int, num_seqs: int, seconds: float) -> None:
        """A step computed num_tokens for num_seqs sequences in seconds (wall time of the model step)."""
        if num_tokens < 1 or seconds <= 0:
            return
        self.budget.model.observe(num_tokens, num_seqs, seconds)
        rate = num_tokens / seconds
        old = self._tokens_per_s
        self._tokens_per_s = rate if old is None else old + _RATE_EWMA * (rate - old)


class FifoPolicy(_Measured):
    """Plain continuous batching: arrival order, every request on level 0, nobody outranks anybody, no
    reserve, no class limits, admission checks only the step's chunk, always the full budget."""

    preempts_between_layers = False

    def new_queue(self) -> WaitingQueue:
        return FifoQueue()

    def priority_of(self, seq: Sequence) -> int:
        return 0

    def outranks(self, a: Sequence, b: Sequence) -> bool:
        return False

    def is_latency(self, seq: Sequence) -> bool:
        return False

    def charge(self, seq: Sequence, tokens: int) -> None:
        pass

    def tokens_to_hold(self, seq: Sequence) -> int:
        return 0

    def queue_timeout(self, seq: Sequence) -> float | None:
        return None

    def choose_budget(self, now: float, running: Iterable[Sequence], waiting: WaitingQueue) -> int:
        return self.budget.maximum


class AdaptivePolicy(_Measured):
    """Classes, deadlines, tenants and the adaptive step budget; see the module docstring."""

    def __init__(self, config: PolicyConfig, max_num_batched_tokens: int) -> None:
        super().__init__(config, max_num_batched_tokens)
        self.ledger = TenantLedger()
        self._latency_levels = sorted({c.priority for c in config.classes.values() if c.latency_sensitive})
        self._last_seen: dict[WorkloadClass, float] = {}  # latency class -> when last waiting/running

    # --- ordering -------------------------------------------------------------------------------------

    def new_queue(self) -> WaitingQueue:
        """An empty waiting queue: by priority, then tenant fair share, then arrival."""
        return PriorityQueue(self.ledger)

    def priority_of(self, seq: Sequence) -> int:
        """seq's priority level (0 first)."""
        return self.class_of(seq).priority

    def outranks(self, a: Sequence, b: Sequence) -> bool:
        """True when a may go before the already-admitted b, taking its budget, seat or blocks."""
        return a.priority < b.priority

    @property
    def preempts_between_layers(self) -> bool:
        """True when latency-class prompts may run between the layers of a step already executing."""
        return self.config.layer_preemption

    def is_latency(self, seq: Sequence) -> bool:
        return self.class_of(seq).latency_sensitive

    def charge(self, seq: Sequence, tokens: int) -> None:
        """tokens were computed for seq this step (tenant fair share)."""
        self.ledger.charge(seq.priority, seq.hints.tenant, tokens)

    # --- admission ------------------------------------------------------------------------------------

    def reserve_fraction(self, seq: Sequence) -> float:
        """Share of the KV pool seq's admission must leave free for latency classes."""
        return 0.0 if self.is_latency(seq) else self.config.latency_reserve

    def tokens_to_hold(self, seq: Sequence) -> int:
        """Tokens whose KV must fit before seq is admitted: its whole remaining prompt plus expected
        output (so admission does not cause a preemption a few steps later)."""
        expected = min(seq.params.max_tokens - seq.num_output_tokens, self.config.expected_output_tokens)
        return seq.num_tokens - seq.num_computed_tokens + max(0, expected)

    def check_queue_room(self, seq: Sequence, waiting: int, waiting_in_class: int, tokens_ahead: int) -> None:
        """AdmissionError when the queue is full, or seq's class already has its limit waiting."""
        super().check_queue_room(seq, waiting, waiting_in_class, tokens_ahead)
        limit = self.class_of(seq).max_waiting
        if limit is not None and waiting_in_class >= limit:
            why = f"the {seq.hints.workload.name} queue is full ({waiting_in_class} waiting, limit {limit})"
            raise self._full(why, tokens_ahead)

    def queue_timeout(self, seq: Sequence) -> float | None:
        """Seconds seq may wait for its first schedule; None: no limit."""
        return self.class_of(seq).queue_timeout_s

    # --- step budget ----------------------------------------------------------------------------------

    def choose_budget(self, now: float, running: Iterable[Sequence], waiting: WaitingQueue) -> int:
        """This step's token budget: the tightest latency target in play decides how long a step may
        take; the latency work's own tokens are never cut."""
        needs = _StepNeeds()
        num_seqs = 0
        for seq in running:
            num_seqs += 1
            if self.is_latency(seq):
                self._add_need(seq, now, needs)
        for level in self._latency_levels:
            for seq in waiting.level(level):
                if self.is_latency(seq):
                    num_seqs += 1
                    self._add_need(seq, now, needs)
        target = min(needs.ttft_slack, needs.itl)
        if target == math.inf and not self.preempts_between_layers:
            # Without layer preemption the next arrival waits out whatever step is running: keep them short.
            target = self._recent_target(now)
        # The most urgent level's tokens are exempt from the target; a less urgent level's only once
        # they have used half their TTFT target: a chat request's step must not grow by an agent's long
        # prompt, but the agent's prompt must not be chunked past its own target either.
        top = min(needs.levels, default=None)
        floor = sum(tokens if level == top else late for level, (tokens, late) in needs.levels.items())
        # Out of reach because a first token is due: run the latency work alone. Out of reach only for
        # an inter-token target: shrinking buys little there, so the controller keeps throughput.
        alone = floor if needs.ttft_slack <= needs.itl else 0
        # Shrinking steps for a smoother stream is bounded by what it costs the throughput classes.
        efficiency = self.config.itl_min_efficiency if needs.itl < needs.ttft_slack else 0.0
        return self.budget.choose(None if target == math.inf else target, num_seqs, floor, alone, efficiency)

    def _add_need(self, seq: Sequence, now: float, needs: _StepNeeds) -> None:
        """Fold one latency-class sequence into this step's needs."""
        policy = self.class_of(seq)
        self._last_seen[seq.hints.workload] = now
        level = needs.levels.setdefault(seq.priority, [0, 0])
        tokens = seq.num_tokens - seq.num_computed_tokens
        level[0] += tokens
        if seq.num_output_tokens == 0:  # still before its first token: the TTFT target applies
            ttft = seq.hints.ttft_slo_s or policy.ttft_slo_s
            if ttft is not None:
                waited = now - seq.arrival_time
                # The step that carries its last prompt chunk must end before the TTFT target.
                needs.ttft_slack = min(needs.ttft_slack, max(0.0, ttft - waited))
                if waited > ttft / 2:
                    level[1] += tokens
        elif policy.itl_slo_s is not None:
            needs.itl = min(needs.itl, policy.itl_slo_s)

    def _recent_target(self, now: float) -> float:
        """With latency traffic seen within latency_memory_s, keep steps short enough that the next
        arrival waits out at most a small part of its TTFT target behind a step already running."""
        target = math.inf
        for workload, seen in self._last_seen.items():
            if now - seen > self.config.latency_memory_s:
                continue
            policy = self.config.classes[workload]
            for slo in (policy.itl_slo_s, policy.ttft_slo_s and policy.ttft_slo_s / 2):
                if slo:
                    target = min(target, slo)
        return target


@dataclass
class _StepNeeds:
    """What the latency work in play asks of one step."""

    ttft_slack: float = math.inf  # seconds left before the tightest first-token target
    itl: float = math.inf  # the tightest inter-token target of a streaming request
    # priority level -> [tokens its latency work needs now, of which past half their TTFT target]
    levels: dict[int, list[int]] = field(default_factory=dict)


def make_policy(config: PolicyConfig | None, max_num_batched_tokens: int) -> SchedulingPolicy:
    """The policy config names (None: adaptive with the default service levels)."""
    config = config or PolicyConfig()
    kind = AdaptivePolicy if config.name is PolicyName.ADAPTIVE else FifoPolicy
    return kind(config, max_num_batched_tokens)


__all__ = ["AdaptivePolicy", "FifoPolicy", "PolicyName", "SchedulingPolicy", "make_policy"]
