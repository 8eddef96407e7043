"""Byte ranges, and the allocator that carves one arena into them. Pure bookkeeping: no torch here."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from services.worker.memory.errors import InvariantError, RangeNotAllocatedError


@dataclass(frozen=True)
class ByteRange:
    """Bytes [offset, offset + nbytes) counted from the start of the arena; nbytes 0 is an empty range."""

    offset: int
    nbytes: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.nbytes < 0:
            raise ValueError(f"a byte range needs offset >= 0 and nbytes >= 0, got {self}")

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.offset + self.nbytes

    def overlaps(self, other: ByteRange) -> bool:
        """True if the two ranges share at least one byte (empty ranges overlap nothing)."""
        return self.offset < other.end and other.offset < self.end


class RangeAllocator:
    """Hands out aligned, non-overlapping ranges of [0, total_bytes) and takes them back.

    Every range handed out starts on a multiple of `alignment` and its nbytes is the request rounded up
    to a multiple of `alignment`, so the ranges themselves are the exact accounting (no hidden padding).
    Placement is best-fit (smallest free range that fits; lowest offset on a tie): the ranges are few,
    large and long-lived, and a model load needs one contiguous weights slot as big as the whole model,
    so keeping the largest hole whole matters more than the scan cost (the free list stays a handful of
    entries). First-fit would nibble the big hole whenever a small KV pool is placed.
    """

    def __init__(self, total_bytes: int, alignment: int = 256) -> None:
        if total_bytes < 1:
            raise ValueError(f"total_bytes must be positive, got {total_bytes}")
        if alignment < 1 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self._total = total_bytes
        self._alignment = alignment
        self._free: list[ByteRange] = [ByteRange(0, total_bytes)]  # sorted by offset, coalesced
        self._used: dict[int, ByteRange] = {}  # offset -> range handed out

    @property
    def total_bytes(self) -> int:
        """Size of the space managed, in bytes."""
        return self._total

    @property
    def alignment(self) -> int:
        """Every offset and size handed out is a multiple of this many bytes."""
        return self._alignment

    @property
    def free_bytes(self) -> int:
        """Bytes not in any range handed out (possibly spread over several holes)."""
        return sum(r.nbytes for r in self._free)

    @property
    def used_bytes(self) -> int:
        """Bytes in ranges handed out (alignment padding included)."""
        return sum(r.nbytes for r in self._used.values())

    @property
    def largest_free(self) -> int:
        """Size in bytes of the largest hole: the most one allocate() can get; 0 when full."""
        return max((r.nbytes for r in self._free), default=0)

    def round_up(self, nbytes: int) -> int:
        """nbytes rounded up to the alignment: what a request of nbytes actually occupies."""
        return -(-nbytes // self._alignment) * self._alignment

    def used_ranges(self) -> list[ByteRange]:
        """The ranges handed out, by offset."""
        return sorted(self._used.values(), key=lambda r: r.offset)

    def free_ranges(self) -> list[ByteRange]:
        """The holes, by offset; adjacent holes are always merged into one."""
        return list(self._free)

    def allocate(self, nbytes: int) -> ByteRange | None:
        """A new range of at least nbytes (> 0), best-fit; None means no hole is large enough."""
        size = self._size_of(nbytes)
        fitting = [(r.nbytes, r.offset, i) for i, r in enumerate(self._free) if r.nbytes >= size]
        if not fitting:
            return None
        _, offset, index = min(fitting)
        return self._take(index, offset, size)

    def allocate_at(self, offset: int, nbytes: int) -> ByteRange | None:
        """The range at exactly offset (a multiple of alignment) of at least nbytes (> 0); None if any
        of it is in use. Lets a caller put back a range it freed a moment ago."""
        if offset % self._alignment:
            raise ValueError(f"offset {offset} is not a multiple of the alignment {self._alignment}")
        size = self._size_of(nbytes)
        index = self._hole_containing(offset)
        if index is None or self._free[index].end < offset + size:
            return None
        return self._take(index, offset, size)

    def free(self, byte_range: ByteRange) -> None:
        """Take back a range this allocator handed out; RangeNotAllocatedError for any other range."""
        self._require_used(byte_range)
        del self._used[byte_range.offset]
        self._give_back(byte_range)

    def try_resize(self, byte_range: ByteRange, new_nbytes: int) -> ByteRange | None:
        """The same range (same offset) resized to at least new_nbytes (> 0): shrinking always works,
        growing works when the space right after it is free. None means it cannot grow in place (the
        range is then unchanged). RangeNotAllocatedError if byte_range was not handed out here."""
        self._require_used(byte_range)
        size = self._size_of(new_nbytes)
        if size == byte_range.nbytes:
            return byte_range
        resized = ByteRange(byte_range.offset, size)
        if size < byte_range.nbytes:
            self._used[byte_range.offset] = resized
            self._give_back(ByteRange(resized.end, byte_range.nbytes - size))
            return resized
        index = self._hole_containing(byte_range.end)
        if index is None or self._free[index].end < resized.end:
            return None
        self._take(index, byte_range.end, size - byte_range.nbytes)
        del self._used[byte_range.end]  # _take recorded the grown-into part as its own range
        self._used[byte_range.offset] = resized
        return resized

    def copy(self) -> RangeAllocator:
        """An independent allocator in the same state, to try a plan without changing this one."""
        clone = RangeAllocator(self._total, self._alignment)
        clone._free = list(self._free)
        clone._used = dict(self._used)
        return clone

    def check(self) -> None:
        """Raise InvariantError unless: ranges are aligned and inside [0, total), nothing overlaps,
        holes are merged, and used + free bytes == total."""
        for r in self._used.values():
            if r.nbytes == 0 or r.offset % self._alignment or r.nbytes % self._alignment:
                raise InvariantError(f"range {r} is empty or not aligned to {self._alignment}")
        for a, b in itertools.pairwise(self._free):
            if a.end >= b.offset:
                raise InvariantError(f"holes {a} and {b} are out of order, overlap or are not merged")
        ranges = sorted([*self._used.values(), *self._free], key=lambda r: r.offset)
        for a, b in itertools.pairwise(ranges):
            if a.end > b.offset:
                raise InvariantError(f"ranges {a} and {b} overlap")
        if ranges and ranges[-1].end > self._total:
            raise InvariantError(f"range {ranges[-1]} ends past the total of {self._total} bytes")
        if self.used_bytes + self.free_bytes != self._total:
            raise InvariantError(
                f"used {self.used_bytes} + free {self.free_bytes} bytes != total {self._total} bytes"
            )

    def _size_of(self, nbytes: int) -> int:
        if nbytes < 1:
            raise ValueError(f"a range needs at least 1 byte, got {nbytes}")
        return self.round_up(nbytes)

    def _require_used(self, byte_range: ByteRange) -> None:
        if self._used.get(byte_range.offset) != byte_range:
            raise RangeNotAllocatedError(f"{byte_range} was not handed out by this allocator (or was freed)")

    def _hole_containing(self, offset: int) -> int | None:
        """Index of the hole holding byte `offset`, or None if that byte is in use or out of range."""
        index = bisect.bisect_right(self._free, offset, key=lambda r: r.offset) - 1
        if index >= 0 and offset < self._free[index].end:
            return index
        return None

    def _take(self, index: int, offset: int, size: int) -> ByteRange:
        """Cut [offset, offset + size) out of hole `index` (which holds it) and record it as used."""
        hole = self._free[index]
        pieces = [
            ByteRange(hole.offset, offset - hole.offset),
            ByteRange(offset + size, hole.end - offset - size),
        ]
        self._free[index : index + 1] = [p for p in pieces if p.nbytes]
        taken = ByteRange(offset, size)
        self._used[offset] = taken
        return taken

    def _give_back(self, byte_range: ByteRange) -> None:
        """Insert a range into the holes, merged with the hole before and after when they touch."""
        index = bisect.bisect_left(self._free, byte_range.offset, key=lambda r: r.offset)
        merged = byte_range
        if index < len(self._free) and self._free[index].offset == merged.end:
            merged = ByteRange(merged.offset, merged.nbytes + self._free.pop(index).nbytes)
        if index > 0 and self._free[index - 1].end == merged.offset:
            index -= 1
            merged = ByteRange(self._free[index].offset, self._free.pop(index).nbytes + merged.nbytes)
        self._free.insert(index, merged)
