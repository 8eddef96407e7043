"""What the scheduler's waiting queue holds, counted as sequences join and leave it: per class, and in
prompt tokens (the retry hint's queue, and the heartbeat's latency prefill). Counted rather than summed,
because a batch queue can hold thousands of sequences and its counts are read after every step."""

from __future__ import annotations

from collections import Counter

from services.common.workload import WorkloadClass
from services.worker.engine.block_manager import BlockManager
from services.worker.engine.sequence import Sequence


class WaitingCounts:
    def __init__(self, block_manager: BlockManager) -> None:
        self._block_manager = block_manager
        self.by_class: Counter[WorkloadClass] = Counter()
        self.tokens = 0  # prompt tokens queued (a sequence's whole: its prefix hits come at admission)
        # Of the latency classes' (all but BATCH's) queued tokens, those the prefix cache did not hold
        # when each sequence joined: the prefill a new latency request would wait behind. Kept per
        # sequence, so that one leaving takes away what it brought, whatever the cache holds by then.
        self.latency_uncached = 0
        self._uncached: dict[str, int] = {}

    def joined(self, seq: Sequence) -> None:
        self.by_class[seq.hints.workload] += 1
        self.tokens += seq.num_tokens
        if seq.hints.workload is not WorkloadClass.BATCH:
            # One hash per block, as admission does again (about 100 us for a 4,200-token prompt on a
            # 2-core CPU VM, against its prefill's seconds there); a batch queue, which can hold
            # thousands, is never looked up.
            uncached = seq.num_tokens - self._block_manager.cached_prefix_tokens(seq)
            self._uncached[seq.request_id] = uncached
            self.latency_uncached += uncached

    def left(self, seq: Sequence) -> None:
        self.by_class[seq.hints.workload] -= 1
        self.tokens -= seq.num_tokens
        if seq.hints.workload is not WorkloadClass.BATCH:
            self.latency_uncached -= self._uncached.pop(seq.request_id)
