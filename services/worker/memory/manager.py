"""The memory manager: carves the arena into one partition per resident model and keeps their LRU order."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Set
from dataclasses import replace

from services.worker.memory.allocator import ByteRange, RangeAllocator
from services.worker.memory.arena import Arena
from services.worker.memory.errors import (
    InvariantError,
    KVTransferError,
    ModelAlreadyResidentError,
    OutOfMemoryError,
    UnknownModelError,
)
from services.worker.memory.partition import Partition, PartitionUsage


class MemoryManager:
    """Byte accounting of one arena: which model holds which ranges, and which was used least recently.

    It moves no bytes and makes no tensors: callers turn a Partition's ranges into views with
    arena.view(). Methods take a lock because loads and evictions come from request threads while the
    engine thread reads partitions; each call is atomic (on failure nothing has changed).
    """

    def __init__(self, arena: Arena, alignment: int = 256) -> None:
        self._arena = arena
        self._allocator = RangeAllocator(arena.total_bytes, alignment)
        # Insertion order is the LRU order: least recently used first; touch() moves a model to the end.
        self._partitions: OrderedDict[str, Partition] = OrderedDict()
        self._lock = threading.RLock()

    @property
    def arena(self) -> Arena:
        """The arena whose bytes are accounted here."""
        return self._arena

    @property
    def alignment(self) -> int:
        """Every range's offset and size is a multiple of this many bytes."""
        return self._allocator.alignment

    @property
    def free_bytes(self) -> int:
        """Arena bytes in no partition (possibly in several holes)."""
        with self._lock:
            return self._allocator.free_bytes

    @property
    def largest_free(self) -> int:
        """Bytes of the largest hole: the most a single new weights slot or KV pool can get now."""
        with self._lock:
            return self._allocator.largest_free

    def __contains__(self, model: object) -> bool:
        with self._lock:
            return model in self._partitions

    def partition(self, model: str) -> Partition:
        """The model's current partition; UnknownModelError if it is not resident."""
        with self._lock:
            if model not in self._partitions:
                raise UnknownModelError(model)
            return self._partitions[model]

    def usage(self) -> dict[str, PartitionUsage]:
        """Bytes each resident model holds, least recently used first."""
        with self._lock:
            return {model: part.usage() for model, part in self._partitions.items()}

    def reserve(self, model: str, weight_bytes: int, kv_bytes: int) -> Partition:
        """A new partition: a weights slot of at least weight_bytes (> 0) and a KV pool of at least
        kv_bytes (>= 0; 0 means no pool), both rounded up to the alignment. The model becomes the most
        recently used. OutOfMemoryError if they do not fit; ModelAlreadyResidentError if it holds one."""
        if not model:
            raise ValueError("a partition needs a non-empty model name")
        if weight_bytes < 1 or kv_bytes < 0:
            raise ValueError(f"need weight_bytes >= 1 and kv_bytes >= 0, got {weight_bytes} and {kv_bytes}")
        with self._lock:
            if model in self._partitions:
                raise ModelAlreadyResidentError(model)
            placed = _place(self._allocator, [weight_bytes, kv_bytes])
            if placed is None:
                needed = self._allocator.round_up(weight_bytes) + self._allocator.round_up(kv_bytes)
                raise self._oom(model, needed, "weights and KV pool", weight_bytes, kv_bytes)
            weights, kv = placed  # weights is a range: weight_bytes >= 1
            part = Partition(model, weights, kv)  # type: ignore[arg-type]
            self._partitions[model] = part
            return part

    def release(self, model: str) -> Partition:
        """Give all of the model's bytes back; returns the partition it held. UnknownModelError if none.
        Copy anything worth keeping (e.g. weights to host) before calling: the bytes may be reused at once."""
        with self._lock:
            part = self.partition(model)
            for byte_range in part.ranges():
                self._allocator.free(byte_range)
            del self._partitions[model]
            return part

    def resize_kv(self, model: str, kv_bytes: int) -> Partition:
        """The model's partition with a KV pool of at least kv_bytes (>= 0; 0 drops the pool): in place
        when it shrinks or the bytes after it are free, else moved to a hole (dropping its contents,
        which the caller must rebuild). OutOfMemoryError if no hole is large enough."""
        if kv_bytes < 0:
            raise ValueError(f"kv_bytes must be >= 0, got {kv_bytes}")
        with self._lock:
            part = self.partition(model)
            part = replace(part, kv=self._resize_range(model, part.kv, kv_bytes))
            self._partitions[model] = part  # an existing key keeps its LRU position
            return part

    def move_kv(self, from_model: str, to_model: str, nbytes: int) -> tuple[Partition, Partition]:
        """Shrink from_model's KV pool by nbytes (> 0, rounded up to the alignment) and grow to_model's by
        the same, for a model under pressure taking KV from an idle one; returns (from, to) partitions.
        The donor shrinks in place (keeping its first bytes) when the taker then fits; otherwise both
        pools may move (see Partition for how to tell). KVTransferError if the donor has fewer bytes;
        OutOfMemoryError if the two pools cannot be placed at all (then nothing changed)."""
        if from_model == to_model:
            raise KVTransferError(f"cannot move KV bytes from model {from_model!r} to itself")
        if nbytes < 1:
            raise KVTransferError(f"must move at least 1 byte of KV, got {nbytes}")
        with self._lock:
            donor, taker = self.partition(from_model), self.partition(to_model)
            size = self._allocator.round_up(nbytes)
            pool = donor.kv
            if pool is None or size > pool.nbytes:
                raise KVTransferError(
                    f"model {from_model!r} holds {donor.kv_bytes} KV bytes, cannot give {size} "
                    f"({nbytes} rounded up to the {self.alignment}-byte alignment)"
                )
            shrunk = self._resize_range(from_model, pool, pool.nbytes - size)
            try:
                grown = self._resize_range(to_model, taker.kv, taker.kv_bytes + size)
            except OutOfMemoryError:
                self._put_back(from_model, shrunk, pool)
                # The donor's freed tail may lie where the taker cannot use it (right after the taker's
                # pool, or between weights slots). Both pools may drop their contents, so place both anew.
                repacked = self._repack([(pool, pool.nbytes - size), (taker.kv, taker.kv_bytes + size)])
                if repacked is None:
                    raise
                shrunk, grown = repacked
            donor, taker = replace(donor, kv=shrunk), replace(taker, kv=grown)
            self._partitions[from_model], self._partitions[to_model] = donor, taker
            return donor, taker

    def touch(self, model: str) -> None:
        """Mark the model as just used (most recently used). UnknownModelError if it is not resident."""
        with self._lock:
            if model not in self._partitions:
                raise UnknownModelError(model)
            self._partitions.move_to_end(model)

    def eviction_candidates(self, busy: Set[str]) -> list[str]:
        """Resident models not in busy, least recently used first: the order to evict them in."""
        with self._lock:
            return [model for model in self._partitions if model not in busy]

    def eviction_plan(self, weight_bytes: int, kv_bytes: int, busy: Set[str]) -> list[str] | None:
        """The fewest least-recently-used idle models whose release would let reserve(weight_bytes,
        kv_bytes) succeed: [] if it fits now, None if it cannot fit even with every idle model evicted.
        Changes nothing; the caller evicts (copying weights to host first) and then reserves."""
        if weight_bytes < 1 or kv_bytes < 0:
            raise ValueError(f"need weight_bytes >= 1 and kv_bytes >= 0, got {weight_bytes} and {kv_bytes}")
        with self._lock:
            trial = self._allocator.copy()
            candidates = self.eviction_candidates(busy)
            for count in range(len(candidates) + 1):
                if count:
                    for byte_range in self._partitions[candidates[count - 1]].ranges():
                        trial.free(byte_range)
                if _place(trial.copy(), [weight_bytes, kv_bytes]) is not None:
                    return candidates[:count]
            return None

    def check(self) -> None:
        """Raise InvariantError unless the allocator is consistent and its ranges in use are exactly the
        partitions' ranges (so partitions never overlap and sum to at most the arena)."""
        with self._lock:
            self._allocator.check()
            held = sorted((r for p in self._partitions.values() for r in p.ranges()), key=lambda r: r.offset)
            if held != self._allocator.used_ranges():
                raise InvariantError(
                    f"partitions hold {held}, the allocator has {self._allocator.used_ranges()}"
                )

    def _resize_range(self, model: str, old: ByteRange | None, nbytes: int) -> ByteRange | None:
        """old (None: no range) resized to nbytes (0: no range), in place if possible, else moved."""
        if nbytes == 0:
            if old is not None:
                self._allocator.free(old)
            return None
        if old is not None:
            resized = self._allocator.try_resize(old, nbytes)
            if resized is not None:
                return resized
            # Its contents may be dropped, so free it first: the new range can then reuse its bytes.
            self._allocator.free(old)
        moved = self._allocator.allocate(nbytes)
        if moved is None:
            error = self._oom(model, self._allocator.round_up(nbytes), "KV pool")
            if old is not None and self._allocator.allocate_at(old.offset, old.nbytes) != old:
                raise InvariantError(f"could not give model {model!r} its KV range {old} back")
            raise error
        return moved

    def _oom(
        self, model: str, needed: int, what: str, weight_bytes: int | None = None, kv_bytes: int | None = None
    ) -> OutOfMemoryError:
        free, largest = self._allocator.free_bytes, self._allocator.largest_free
        return OutOfMemoryError(
            model, needed, free, largest, what=what, weight_bytes=weight_bytes, kv_bytes=kv_bytes
        )

    def _put_back(self, model: str, current: ByteRange | None, original: ByteRange) -> None:
        """Return a pool shrunk in place (current; None if dropped) to its original range, whose freed
        tail nothing can have taken since (we hold the lock)."""
        if current is None:
            back = self._allocator.allocate_at(original.offset, original.nbytes)
        else:
            back = self._allocator.try_resize(current, original.nbytes)
        if back != original:
            raise InvariantError(f"could not give model {model!r} its KV range {original} back")

    def _repack(self, pools: list[tuple[ByteRange | None, int]]) -> list[ByteRange | None] | None:
        """Free each (old range, new size) pair's old range and place all the new sizes (0: no range);
        None, with every old range back where it was, if they do not all fit."""
        for old, _ in pools:
            if old is not None:
                self._allocator.free(old)
        placed = _place(self._allocator, [size for _, size in pools])
        if placed is None:
            for old, _ in pools:
                if old is not None and self._allocator.allocate_at(old.offset, old.nbytes) != old:
                    raise InvariantError(f"could not put KV range {old} back")
        return placed


def _place(allocator: RangeAllocator, sizes: list[int]) -> list[ByteRange | None] | None:
    """One new range per size (None for a size of 0) taken from allocator, or None with the allocator
    unchanged if they do not all fit. Largest first, as in first-fit-decreasing bin packing: the largest
    range has the fewest holes it fits in, so it chooses before the small ones split them."""
    taken: list[ByteRange | None] = [None] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if sizes[i] == 0:
            continue
        taken[i] = allocator.allocate(sizes[i])
        if taken[i] is None:
            for byte_range in taken:
                if byte_range is not None:
                    allocator.free(byte_range)
            return None
    return taken
