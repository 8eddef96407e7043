"""Iteration-level continuous batching, scheduled by tokens (the vLLM v1 rule). No torch here.

Each step every scheduled sequence gets n = min(tokens it has not computed, budget left) tokens: 1 for
a decode, a chunk for a prompt (chunked prefill); prefix-cache hits are already counted as computed,
so they cost nothing.

Order within a step follows the policy (policy/): the running set is kept sorted by its rank (class
priority, then admission order) and a waiting request is admitted before a running one only when it
outranks it, taking its place in the budget and, if seats or blocks are short, its KV (preemption by
recompute, lowest priority and most recently admitted first). Under `fifo` nothing outranks anything,
so running sequences go first and waiting ones are admitted in arrival order after, as in vLLM.

Layer-level preemption (adaptive): `schedule_urgent` admits latency-class requests at the head of the
queue into free seats and blocks, never touching the running set, so the engine can run them in a step of
their own even between the layers of another step that is already executing. A chat prompt then waits
for at most one layer of a long batch step, not the whole step, and batch steps keep their size.

Progress guarantee: `add` rejects a prompt larger than the whole KV pool, and `update` finishes a
sequence with LENGTH once it fills the pool, so a sequence alone in the pool always fits. Within one
`schedule` call every loop iteration schedules, preempts or stops, so the call never spins.
"""

from __future__ import annotations

import bisect
import itertools
import time

from services.common.workload import WorkloadClass
from services.worker.engine.block_manager import BlockManager
from services.worker.engine.errors import AdmissionError, InvalidRequestError
from services.worker.engine.policy.policy import make_policy
from services.worker.engine.scheduled_batch import ScheduledBatch
from services.worker.engine.scheduler_config import SchedulerConfig
from services.worker.engine.sequence import FinishReason, Sequence, SequenceStatus
from services.worker.engine.stopping import check_stop
from services.worker.engine.waiting_counts import WaitingCounts


class Scheduler:
    """Decides, step by step, which sequences compute how many tokens; owns their block lifecycle."""

    # Queue timeouts are checked at most this often: a scan of a long batch queue every step would cost
    # more than the timeout's precision is worth.
    EXPIRY_INTERVAL_S = 0.05

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.policy = make_policy(config.policy, config.max_num_batched_tokens)
        self._waiting = self.policy.new_queue()
        self._counts = WaitingCounts(block_manager)
        self._running: list[Sequence] = []  # sorted by policy.running_key; preemption takes from the back
        self._by_id: dict[str, Sequence] = {}  # every unfinished sequence
        self._admits = itertools.count(1)
        self._next_expiry = 0.0
        self._watermark_blocks = int(config.watermark * block_manager.num_blocks)
        self._pool_tokens = block_manager.num_blocks * block_manager.block_size
        # A sequence that fills the whole pool cannot grow; treating that as "context full" is what
        # keeps a lone oversized sequence from preempting itself forever.
        self._max_len = min(config.max_model_len, self._pool_tokens)

    @property
    def num_running(self) -> int:
        """Sequences admitted and holding blocks (scheduled or not this step)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences queued for (re-)admission."""
        return len(self._waiting)

    @property
    def has_unfinished(self) -> bool:
        """True while any added sequence is neither finished nor aborted."""
        return bool(self._by_id)

    def request_ids(self) -> list[str]:
        """Ids of every unfinished sequence, waiting or running."""
        return list(self._by_id)

    def unfinished(self) -> list[Sequence]:
        """Every unfinished sequence, waiting or running."""
        return list(self._by_id.values())

    def resize_pool(self, num_blocks: int) -> None:
        """Re-derive the limits that depend on the KV pool's size after the block manager was resized to
        num_blocks (KV repartitioning): the watermark, the pool's token capacity, the longest sequence."""
        self._watermark_blocks = int(self.config.watermark * num_blocks)
        self._pool_tokens = num_blocks * self.block_manager.block_size
        self._max_len = min(self.config.max_model_len, self._pool_tokens)

    def preempt_all(self) -> list[Sequence]:
        """Send every running sequence back to the queue to recompute (its KV is gone: the pool moved);
        the preempted, highest-ranked first in the queue as after ordinary preemption."""
        running = list(self._running)
        for seq in reversed(running):  # each requeue goes to the front, so the highest ends up first
            self._preempt(seq)
        self._running.clear()
        return running

    def running_of(self, workload: WorkloadClass) -> int:
        """Sequences of one workload class admitted and holding blocks (counted: the running list
        changes in too many places for a counter to stay right, and it holds at most max_num_seqs)."""
        return sum(1 for seq in self._running if seq.hints.workload is workload)

    def waiting_of(self, workload: WorkloadClass) -> int:
        """Sequences of one workload class queued for (re-)admission."""
        return self._counts.by_class[workload]

    def latency_prompt_tokens(self) -> int:
        """Prompt tokens not yet computed of every class's sequences but BATCH's, queued or admitted:
        the prefill a new latency request waits behind, since the policy serves the latency classes
        ahead of batch (the heartbeat reports it to the placer). A queued sequence counts what the
        prefix cache did not hold of it when it joined (its hits are final only at admission); the
        running list holds at most max_num_seqs."""
        batch = WorkloadClass.BATCH
        admitted = sum(
            seq.num_tokens - seq.num_computed_tokens
            for seq in self._running
            if seq.num_computed_tokens < seq.num_prompt_tokens and seq.hints.workload is not batch
        )
        return admitted + self._counts.latency_uncached

    def add(self, seq: Sequence) -> None:
        """Queue a WAITING sequence; InvalidRequestError if it can never fit, AdmissionError if its
        class's queue is full (nothing is queued then)."""
        if seq.request_id in self._by_id:
            raise InvalidRequestError("request_id", f"{seq.request_id!r} is already in flight")
        if seq.status is not SequenceStatus.WAITING or seq.block_table:
            raise InvalidRequestError("request_id", f"{seq.request_id!r} is not a fresh waiting sequence")
        if seq.num_tokens == 0:
            raise InvalidRequestError("prompt", "must hold at least one token")
        if seq.num_tokens > self._pool_tokens:
            raise InvalidRequestError(
                "prompt", f"{seq.num_tokens} tokens exceed the KV pool of {self._pool_tokens} tokens"
            )
        seq.priority = self.policy.priority_of(seq)
        self.policy.check_queue_room(
            seq, len(self._waiting), self._counts.by_class[seq.hints.workload], self._counts.tokens
        )
        self._by_id[seq.request_id] = seq
        self._enqueue(seq)

    def abort(self, request_id: str) -> Sequence | None:
        """Finish request_id with ABORT and free its blocks; None if unknown or already finished."""
        seq = self._by_id.get(request_id)
        if seq is None:
            return None
        self.finish(seq, FinishReason.ABORT)
        return seq

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Engine-initiated finish (stop string, abort): free blocks now; no-op if already finished."""
        if self._by_id.pop(seq.request_id, None) is not seq:
            return
        if seq.status is SequenceStatus.WAITING:
            self._waiting.remove(seq)
            self._counts.left(seq)
        else:
            self._running.remove(seq)
        self._release(seq, reason)

    def schedule(self, now: float | None = None) -> ScheduledBatch | None:
        """Build this step's batch; None if there is nothing to compute and nobody to refuse.

        now: time.monotonic() (a parameter so tests can drive queue timeouts and SLO slack).
        """
        now = time.monotonic() if now is None else now
        batch = ScheduledBatch()
        if now >= self._next_expiry:
            self._next_expiry = now + self.EXPIRY_INTERVAL_S
            self._expire(now, batch)
        batch.budget = self.policy.choose_budget(now, self._running, self._waiting)
        self._fill(batch, batch.budget, now)
        return batch if batch.seqs or batch.rejected else None

    def schedule_urgent(
        self, now: float | None = None, outranking: list[Sequence] | None = None
    ) -> ScheduledBatch | None:
        """A batch of the latency-class requests heading the queue that fit into free seats and blocks
        now (with their expected growth, and the watermark kept), up to the step budget; None when there
        are none or the policy does not preempt between layers. Nothing running is displaced or
        rescheduled, so this is safe while another batch is executing (the engine calls it between that
        batch's layers). A prompt longer than the budget gets its first chunk; the rest continues in
        ordinary steps. Only the head's priority level is taken. outranking: only requests that outrank
        every one of these (a chat prompt may interrupt an urgent step of agent prompts, not another
        chat's)."""
        policy = self.policy
        if not policy.preempts_between_layers:
            return None
        head = self._waiting.peek()

        def eligible(head: Sequence | None) -> bool:
            if head is None or not policy.is_latency(head):
                return False
            return outranking is None or all(policy.outranks(head, s) for s in outranking)

        if not eligible(head):
            return None
        assert head is not None
        # One priority level per urgent step: a chat prompt's first token must not wait for an agent's
        # long prompt that happened to arrive with it (that one gets the next urgent step).
        level = head.priority
        now = time.monotonic() if now is None else now
        batch = ScheduledBatch(budget=self.config.max_num_batched_tokens)
        budget = batch.budget
        while eligible(head) and budget > 0:
            assert head is not None
            if head.priority != level:
                break
            # The ordinary admission, with nothing it may displace: every running sequence counts as
            # already scheduled (a batch may be executing), so only free seats and blocks are taken.
            held = len(self._running)
            n, _ = self._admit(head, batch, budget, held, held, 0)
            if n == 0:
                break
            self._counts.left(self._waiting.pop())
            self._start_running(head, now)
            bisect.insort(self._running, head, key=policy.running_key)
            batch.add(head, n)
            budget -= n
            head = self._waiting.peek()
        return batch if batch.seqs else None

    def observe_step(self, batch: ScheduledBatch, seconds: float) -> None:
        """The model computed batch in seconds; feeds the budget controller's step-time model."""
        self.policy.observe_step(batch.total_tokens, len(batch.seqs), seconds)

    def update(self, batch: ScheduledBatch, sampled: list[int | None]) -> list[Sequence]:
        """Apply a finished step: advance progress, cache full blocks, append samples, stop; returns finished.

        sampled[i] is the token drawn for batch.seqs[i], or None; it is ignored unless will_sample[i]
        (a partial prefill chunk has nothing to sample). Sequences finished meanwhile are skipped.
        """
        if len(sampled) != len(batch.seqs):
            raise ValueError(f"got {len(sampled)} samples for {len(batch.seqs)} sequences")
        bm = self.block_manager
        policy = self.policy
        finished: list[Sequence] = []
        rows = zip(batch.seqs, batch.num_tokens, batch.will_sample, sampled, strict=True)
        for seq, n, sample, token in rows:
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted or finished after the batch was built; its blocks are gone
            seq.num_computed_tokens += n
            policy.charge(seq, n)
            bm.commit(seq)
            if not sample or token is None:
                continue
            seq.token_ids.append(token)
            reason = check_stop(seq, self._max_len)
            if reason is not None:
                del self._by_id[seq.request_id]
                self._release(seq, reason)
                finished.append(seq)
        if finished:
            # One rebuild instead of a list.remove per finished sequence.
            self._running = [s for s in self._running if s.status is SequenceStatus.RUNNING]
        return finished

    def _fill(self, batch: ScheduledBatch, budget: int, now: float) -> None:
        """Spend budget in rank order over running sequences and waiting heads.

        running[:i] are served, running[end:] were preempted during this call; admitted ones wait in
        `new` and join the running set (in rank order) at the end, so indices stay valid meanwhile.
        """
        bm = self.block_manager
        policy = self.policy
        running = self._running
        waiting = self._waiting
        new: list[Sequence] = []
        end = len(running)
        i = 0
        can_admit = True
        while budget > 0:
            seq = running[i] if i < end else None
            head = waiting.peek() if can_admit else None
            if head is not None and (seq is None or policy.outranks(head, seq)):
                # After a preemption, only a request that outranks every victim may come in: anything
                # else would take the room the victims need to come back, and thrash.
                if any(not policy.outranks(head, v) for v in batch.preempted):
                    can_admit = False
                    continue
                n, end = self._admit(head, batch, budget, i, end, len(new))
                if n == 0:
                    can_admit = False  # head-of-line: never skip ahead of the queue's order
                    continue
                self._counts.left(waiting.pop())
                self._start_running(head, now)
                new.append(head)
                batch.add(head, n)
                budget -= n
                continue
            if seq is None:
                break
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if n <= 0:
                i += 1  # nothing to compute until a token is appended; never happens with a sane runner
                continue
            while not bm.allocate(seq, n):
                # Only running[i:end] are unscheduled this step, so a scheduled sequence is never the victim.
                end -= 1
                victim = running[end]
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                batch.add(seq, n)
                budget -= n
                i += 1
        if end < len(running):
            del running[end:]
        for seq in new:
            bisect.insort(running, seq, key=policy.running_key)

    def _admit(
        self, head: Sequence, batch: ScheduledBatch, budget: int, i: int, end: int, num_new: int
    ) -> tuple[int, int]:
        """Make room for head (seat, blocks for its prompt and expected growth, the latency reserve),
        displacing outranked unscheduled running sequences if needed, and allocate its first chunk.
        Returns (tokens scheduled, 0 if it does not fit; the new end of the unpreempted running set)."""
        bm = self.block_manager
        policy = self.policy
        running = self._running
        bm.admit(head)
        n = min(head.num_tokens - head.num_computed_tokens, budget)
        while True:
            holding = end + num_new
            seats = self.config.max_num_seqs
            if holding == 0:
                # Alone in the engine it must get in (it fits the pool; add() checked), or nothing moves.
                need, reserve = n, 0
            else:
                need = max(n, policy.tokens_to_hold(head))
                reserve = self._watermark_blocks + int(policy.reserve_fraction(head) * bm.num_blocks)
                seats -= policy.reserved_seats(head, seats)
            seated = holding < seats
            if seated and bm.blocks_needed(head, need) + reserve <= bm.num_free_blocks:
                break
            if end <= i or not policy.outranks(head, running[end - 1]):
                bm.unadmit(head)
                return 0, end
            end -= 1
            victim = running[end]
            self._preempt(victim)
            batch.preempted.append(victim)
        if not bm.allocate(head, n):
            raise AssertionError("allocate failed after blocks_needed said it fits")  # a bug, not input
        return n, end

    def _start_running(self, seq: Sequence, now: float) -> None:
        seq.status = SequenceStatus.RUNNING
        seq.admit_no = next(self._admits)
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = now

    def _expire(self, now: float, batch: ScheduledBatch) -> None:
        """Refuse never-scheduled requests that waited longer than their class allows. A preempted one
        already streamed tokens, so it is never refused: it resumes."""
        policy = self.policy
        expired = []
        for seq in self._waiting:
            timeout = policy.queue_timeout(seq)
            if timeout is not None and seq.first_scheduled_time is None and now - seq.arrival_time > timeout:
                expired.append((seq, timeout))
        for seq, timeout in expired:
            del self._by_id[seq.request_id]
            self._waiting.remove(seq)
            self._counts.left(seq)
            self._release(seq, FinishReason.ABORT)
            error = AdmissionError(
                f"not scheduled within the {seq.hints.workload.name} queue timeout of {timeout:g} s "
                f"({self.num_waiting} requests waiting)",
                retry_after_s=policy.retry_after(self._counts.tokens),
                reason=AdmissionError.QUEUE_TIMEOUT,
            )
            batch.rejected.append((seq, error))

    def _enqueue(self, seq: Sequence) -> None:
        self._waiting.push(seq)
        self._counts.joined(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Drop seq's blocks and requeue it to recompute (prefix caching makes that cheap)."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self._waiting.requeue(seq)
        self._counts.joined(seq)

    def _release(self, seq: Sequence, reason: FinishReason) -> None:
        """Mark seq finished with reason and give its blocks back."""
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
