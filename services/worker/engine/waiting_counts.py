"""What the scheduler's waiting queue holds, counted as sequences join and leave it: per class, and in
prompt tokens (the retry hint's queue, and the heartbeat's latency prefill). Counted rather than summed,
because a batch queue can hold thousands of sequences and its counts are read after every step."""

from __future__ import annotations

from collections import Counter

from services.common.workload import WorkloadClass
from services.worker.engine.sequence import Sequence


class WaitingCounts:
    def __init__(self) -> None:
        self.by_class: Counter[WorkloadClass] = Counter()
        self.tokens = 0  # prompt tokens queued (a sequence's whole: its prefix hits come at admission)
        self.batch_tokens = 0  # of those, the BATCH class's

    def joined(self, seq: Sequence) -> None:
        self.by_class[seq.hints.workload] += 1
        self.tokens += seq.num_tokens
        if seq.hints.workload is WorkloadClass.BATCH:
            self.batch_tokens += seq.num_tokens

    def left(self, seq: Sequence) -> None:
        self.by_class[seq.hints.workload] -= 1
        self.tokens -= seq.num_tokens
        if seq.hints.workload is WorkloadClass.BATCH:
            self.batch_tokens -= seq.num_tokens
