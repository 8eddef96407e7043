"""Iteration-level continuous batching, scheduled by tokens (the vLLM v1 rule). No torch here.

Each step every scheduled sequence gets n = min(tokens it has not computed, budget left) tokens: 1 for
a decode, a chunk for a prompt (chunked prefill); prefix-cache hits are already counted as computed,
so they cost nothing. Running sequences go first; waiting ones are admitted in queue order after.

Progress guarantee: `add` rejects a prompt larger than the whole KV pool, and `update` finishes a
sequence with LENGTH once it fills the pool, so a sequence alone in the pool always fits. Within one
`schedule` call every loop iteration schedules, preempts or stops, so the call never spins.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from services.worker.engine.block_manager import BlockManager
from services.worker.engine.errors import InvalidRequestError
from services.worker.engine.sequence import FinishReason, Sequence, SequenceStatus
from services.worker.engine.stopping import check_stop


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Per-step limits. watermark: fraction of blocks left free when admitting new work, so a fresh
    admission does not force a preemption on the very next decode step."""

    max_model_len: int
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    watermark: float = 0.01

    def __post_init__(self) -> None:
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")


@dataclass
class ScheduledBatch:
    """One step's work: seqs[i] computes num_tokens[i] tokens starting at its num_computed_tokens.

    will_sample[i] is True when that chunk reaches the end of seqs[i]'s tokens, i.e. the model must
    sample a token for it; fixed when the batch is built, so it stays valid while update() runs.
    """

    seqs: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    will_sample: list[bool] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # preempted while building this batch
    total_tokens: int = 0

    def add(self, seq: Sequence, n: int) -> None:
        """Append seq computing n >= 1 tokens this step."""
        self.seqs.append(seq)
        self.num_tokens.append(n)
        self.will_sample.append(seq.num_computed_tokens + n == seq.num_tokens)
        self.total_tokens += n


class WaitingQueue:
    """Admission order of waiting sequences: FCFS. The one place to swap in a priority policy."""

    def __init__(self) -> None:
        self._queue: deque[Sequence] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, seq: Sequence) -> None:
        """Queue a new sequence behind every earlier one."""
        self._queue.append(seq)

    def push_front(self, seq: Sequence) -> None:
        """Requeue a preempted sequence ahead of everything: it was admitted before any waiter."""
        self._queue.appendleft(seq)

    def peek(self) -> Sequence | None:
        """The next sequence to admit; None when empty."""
        return self._queue[0] if self._queue else None

    def pop(self) -> Sequence:
        """Remove and return the sequence `peek` returned."""
        return self._queue.popleft()

    def remove(self, seq: Sequence) -> None:
        """Drop seq from the queue (abort/finish); O(n), which is fine off the per-step path."""
        self._queue.remove(seq)


class Scheduler:
    """Decides, step by step, which sequences compute how many tokens; owns their block lifecycle."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self._waiting = WaitingQueue()
        self._running: list[Sequence] = []  # admission order; preemption takes from the back
        self._by_id: dict[str, Sequence] = {}  # every unfinished sequence
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

    def add(self, seq: Sequence) -> None:
        """Queue a WAITING sequence (FCFS); raises InvalidRequestError if it can never fit."""
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
        self._by_id[seq.request_id] = seq
        self._waiting.push(seq)

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
        else:
            self._running.remove(seq)
        self._release(seq, reason)

    def schedule(self) -> ScheduledBatch | None:
        """Build this step's batch within max_num_batched_tokens and max_num_seqs; None if nothing to do."""
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(batch, budget)
        # After a preemption there is no room to spare, so admitting new work would only thrash.
        if not batch.preempted:
            self._schedule_waiting(batch, budget)
        return batch if batch.seqs else None

    def update(self, batch: ScheduledBatch, sampled: list[int | None]) -> list[Sequence]:
        """Apply a finished step: advance progress, cache full blocks, append samples, stop; returns finished.

        sampled[i] is the token drawn for batch.seqs[i], or None; it is ignored unless will_sample[i]
        (a partial prefill chunk has nothing to sample). Sequences finished meanwhile are skipped.
        """
        if len(sampled) != len(batch.seqs):
            raise ValueError(f"got {len(sampled)} samples for {len(batch.seqs)} sequences")
        bm = self.block_manager
        finished: list[Sequence] = []
        rows = zip(batch.seqs, batch.num_tokens, batch.will_sample, sampled, strict=True)
        for seq, n, sample, token in rows:
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted or finished after the batch was built; its blocks are gone
            seq.num_computed_tokens += n
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

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        """Serve running sequences in admission order, preempting from the back; returns budget left."""
        bm = self.block_manager
        running = self._running
        end = len(running)  # running[end:] were preempted during this call
        i = 0
        while i < end and budget > 0:
            seq = running[i]
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
        return budget

    def _schedule_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        """Admit waiting sequences in queue order while budget and seats last; stop at the first misfit."""
        bm = self.block_manager
        waiting = self._waiting
        running = self._running
        max_seqs = self.config.max_num_seqs
        while budget > 0 and len(running) < max_seqs:
            seq = waiting.peek()
            if seq is None:
                return
            bm.admit(seq)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            # The watermark protects running sequences; with none running it would only block progress.
            reserve = self._watermark_blocks if running else 0
            if not bm.allocate(seq, n, reserve=reserve):
                bm.unadmit(seq)
                return  # head-of-line: never skip ahead of the queue's order
            waiting.pop()
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            running.append(seq)
            batch.add(seq, n)
            budget -= n

    def _preempt(self, seq: Sequence) -> None:
        """Drop seq's blocks and requeue it at the front to recompute (prefix caching makes that cheap)."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self._waiting.push_front(seq)

    def _release(self, seq: Sequence, reason: FinishReason) -> None:
        """Mark seq finished with reason and give its blocks back."""
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
