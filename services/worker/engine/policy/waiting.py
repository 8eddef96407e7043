"""Waiting queues: the order in which queued (and preempted) sequences are admitted.

FifoQueue is arrival order, the plain continuous-batching baseline. PriorityQueue admits by class
priority, then shares each priority level between tenants by tokens served, then earliest deadline
first within a tenant (arrival breaks ties). A preempted sequence goes back under its original keys,
so it resumes ahead of everything that arrived after it.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator
from typing import Protocol

from services.worker.engine.policy.tenants import TenantLedger
from services.worker.engine.sequence import Sequence


class WaitingQueue(Protocol):
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Sequence]: ...
    def push(self, seq: Sequence) -> None:
        """Queue a new sequence."""

    def requeue(self, seq: Sequence) -> None:
        """Queue a preempted sequence again."""

    def peek(self) -> Sequence | None:
        """The next sequence to admit; None when empty."""

    def pop(self) -> Sequence:
        """Remove and return the sequence `peek` returned."""

    def remove(self, seq: Sequence) -> None:
        """Drop seq (abort, finish, timeout); O(n), off the per-step path."""

    def level(self, priority: int) -> Iterator[Sequence]:
        """The waiting sequences of one priority level, in no particular order."""


class FifoQueue:
    """Arrival order; a preempted sequence goes to the front (it was admitted before any waiter)."""

    def __init__(self) -> None:
        self._queue: deque[Sequence] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._queue)

    def push(self, seq: Sequence) -> None:
        self._queue.append(seq)

    def requeue(self, seq: Sequence) -> None:
        self._queue.appendleft(seq)

    def peek(self) -> Sequence | None:
        return self._queue[0] if self._queue else None

    def pop(self) -> Sequence:
        return self._queue.popleft()

    def remove(self, seq: Sequence) -> None:
        self._queue.remove(seq)

    def level(self, priority: int) -> Iterator[Sequence]:
        return (s for s in self._queue if s.priority == priority)


_Entry = tuple[float, float, int, Sequence]  # (deadline or inf, arrival, tie-break, seq)


class PriorityQueue:
    """Priority level, then the tenant with the fewest tokens served, then EDF within the tenant."""

    def __init__(self, ledger: TenantLedger) -> None:
        self._ledger = ledger
        # priority -> tenant -> heap; empty heaps and levels are deleted so peek only scans live ones.
        self._levels: dict[int, dict[str, list[_Entry]]] = {}
        self._len = 0
        self._tie = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Sequence]:
        for tenants in self._levels.values():
            for heap in tenants.values():
                for entry in heap:
                    yield entry[3]

    def push(self, seq: Sequence) -> None:
        tenants = self._levels.setdefault(seq.priority, {})
        tenant = seq.hints.tenant
        heap = tenants.get(tenant)
        if heap is None:
            self._ledger.activate(seq.priority, tenant, list(tenants))
            heap = tenants[tenant] = []
        deadline = seq.hints.deadline
        self._tie += 1
        heapq.heappush(heap, (math.inf if deadline is None else deadline, seq.arrival_time, self._tie, seq))
        self._len += 1

    requeue = push

    def peek(self) -> Sequence | None:
        if not self._levels:
            return None
        level = min(self._levels)
        served = self._ledger.served
        # Few tenants wait at one level at a time, so a scan beats keeping a second heap in sync.
        best = min(self._levels[level].items(), key=lambda item: (served(level, item[0]), item[1][0]))
        return best[1][0][3]

    def pop(self) -> Sequence:
        seq = self.peek()
        if seq is None:
            raise IndexError("pop from an empty queue")
        heap = self._levels[seq.priority][seq.hints.tenant]
        heapq.heappop(heap)
        self._drop_if_empty(seq, heap)
        return seq

    def remove(self, seq: Sequence) -> None:
        heap = self._levels[seq.priority][seq.hints.tenant]
        index = next(i for i, entry in enumerate(heap) if entry[3] is seq)
        heap[index] = heap[-1]
        heap.pop()
        heapq.heapify(heap)
        self._drop_if_empty(seq, heap)

    def level(self, priority: int) -> Iterator[Sequence]:
        for heap in self._levels.get(priority, {}).values():
            for entry in heap:
                yield entry[3]

    def _drop_if_empty(self, seq: Sequence, heap: list[_Entry]) -> None:
        self._len -= 1
        if heap:
            return
        tenants = self._levels[seq.priority]
        del tenants[seq.hints.tenant]
        if not tenants:
            del self._levels[seq.priority]
