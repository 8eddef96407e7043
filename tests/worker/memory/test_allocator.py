"""RangeAllocator: alignment, best-fit, exhaustion, coalescing, resizing, and its invariant check."""

from __future__ import annotations

import itertools
import random

import pytest

from services.worker.memory.allocator import ByteRange, RangeAllocator
from services.worker.memory.errors import InvariantError, RangeNotAllocatedError


@pytest.mark.parametrize(
    ("request_bytes", "expected_nbytes"),
    [(1, 256), (255, 256), (256, 256), (257, 512), (1000, 1024), (4096, 4096)],
)
def test_allocate_rounds_up_to_alignment(request_bytes: int, expected_nbytes: int) -> None:
    alloc = RangeAllocator(8192, alignment=256)
    first = alloc.allocate(request_bytes)
    second = alloc.allocate(1)
    assert first == ByteRange(0, expected_nbytes)
    assert second == ByteRange(expected_nbytes, 256)  # the next range starts aligned
    alloc.check()


@pytest.mark.parametrize(
    ("total", "requests", "expected"),
    [
        (1024, [1024, 1], [ByteRange(0, 1024), None]),
        (1024, [1025], [None]),
        (1024, [512, 512, 1], [ByteRange(0, 512), ByteRange(512, 512), None]),
        # A tail shorter than the alignment can never be handed out, but is still accounted as free.
        (1000, [768, 1], [ByteRange(0, 768), None]),
    ],
)
def test_exhaustion_returns_none(total: int, requests: list[int], expected: list[ByteRange | None]) -> None:
    alloc = RangeAllocator(total, alignment=256)
    assert [alloc.allocate(n) for n in requests] == expected
    alloc.check()


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: RangeAllocator(0), ValueError),
        (lambda: RangeAllocator(1024, alignment=0), ValueError),
        (lambda: RangeAllocator(1024, alignment=384), ValueError),
        (lambda: RangeAllocator(1024).allocate(0), ValueError),
        (lambda: RangeAllocator(1024).allocate_at(100, 256), ValueError),
        (lambda: RangeAllocator(1024).free(ByteRange(0, 256)), RangeNotAllocatedError),
        (lambda: RangeAllocator(1024).try_resize(ByteRange(0, 256), 512), RangeNotAllocatedError),
        (lambda: ByteRange(-1, 10), ValueError),
        (lambda: ByteRange(0, -1), ValueError),
    ],
)
def test_bad_arguments_raise(call: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        call()  # type: ignore[operator]


def test_best_fit_picks_the_tightest_hole() -> None:
    alloc = RangeAllocator(4096, alignment=256)
    a, _, c, _ = (alloc.allocate(n) for n in (1024, 256, 512, 256))
    assert a is not None and c is not None
    alloc.free(a)  # hole of 1024 at 0
    alloc.free(c)  # hole of 512 at 1280, plus the 2048 tail
    assert alloc.allocate(512) == ByteRange(1280, 512)  # not the 1024 hole, not the tail
    assert alloc.allocate(1024) == ByteRange(0, 1024)
    alloc.check()


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_freed_neighbours_coalesce_in_any_order(order: tuple[int, ...]) -> None:
    alloc = RangeAllocator(1024, alignment=256)
    ranges = [alloc.allocate(256) for _ in range(3)]
    for i in order:
        alloc.free(ranges[i])  # type: ignore[arg-type]
        alloc.check()
    assert alloc.free_ranges() == [ByteRange(0, 1024)]
    assert alloc.largest_free == 1024


def test_double_free_is_refused() -> None:
    alloc = RangeAllocator(1024)
    a = alloc.allocate(256)
    assert a is not None
    alloc.free(a)
    with pytest.raises(RangeNotAllocatedError):
        alloc.free(a)
    with pytest.raises(RangeNotAllocatedError):
        alloc.free(ByteRange(0, 512))  # same offset, wrong size: not what was handed out


def _two_adjacent() -> tuple[RangeAllocator, ByteRange]:
    alloc = RangeAllocator(4096, alignment=256)
    a = alloc.allocate(512)
    alloc.allocate(512)  # right after a: blocks growing in place
    assert a is not None
    return alloc, a


def _alone() -> tuple[RangeAllocator, ByteRange]:
    alloc = RangeAllocator(4096, alignment=256)
    a = alloc.allocate(512)
    assert a is not None
    return alloc, a


@pytest.mark.parametrize(
    ("setup", "new_nbytes", "expected"),
    [
        (_alone, 512, ByteRange(0, 512)),  # same size
        (_alone, 100, ByteRange(0, 256)),  # shrink, rounded up
        (_alone, 2000, ByteRange(0, 2048)),  # grow into the free space after it
        (_alone, 4096, ByteRange(0, 4096)),  # grow to exactly the end
        (_alone, 4097, None),  # past the end
        (_two_adjacent, 300, ByteRange(0, 512)),  # shrink rounds to the same size
        (_two_adjacent, 256, ByteRange(0, 256)),  # shrink next to a used range
        (_two_adjacent, 768, None),  # the next range is in use
    ],
)
def test_try_resize(setup: object, new_nbytes: int, expected: ByteRange | None) -> None:
    alloc, a = setup()  # type: ignore[operator]
    before = alloc.used_ranges()
    assert alloc.try_resize(a, new_nbytes) == expected
    alloc.check()
    if expected is None:
        assert alloc.used_ranges() == before  # a failed grow changes nothing
    else:
        assert expected in alloc.used_ranges() and a.offset == expected.offset


def test_shrunk_tail_merges_with_following_hole() -> None:
    alloc, a = _alone()
    shrunk = alloc.try_resize(a, 256)
    assert shrunk == ByteRange(0, 256)
    assert alloc.free_ranges() == [ByteRange(256, 4096 - 256)]


def test_allocate_at_takes_exactly_that_range_or_nothing() -> None:
    alloc = RangeAllocator(2048, alignment=256)
    assert alloc.allocate_at(512, 300) == ByteRange(512, 512)
    assert alloc.allocate_at(768, 256) is None  # overlaps the range just taken
    assert alloc.allocate_at(1792, 512) is None  # runs past the end
    assert alloc.free_ranges() == [ByteRange(0, 512), ByteRange(1024, 1024)]
    alloc.check()


def test_copy_is_independent() -> None:
    alloc = RangeAllocator(1024)
    clone = alloc.copy()
    assert clone.allocate(1024) is not None
    assert alloc.free_bytes == 1024 and clone.free_bytes == 0


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda a: a._used.__setitem__(0, ByteRange(0, 256)),  # overlaps the hole at 0
        lambda a: a._used.__setitem__(100, ByteRange(100, 256)),  # misaligned
        lambda a: a._free.append(ByteRange(4096, 256)),  # past the end, and not merged
        lambda a: a._free.pop(),  # bytes lost: used + free != total
    ],
)
def test_check_detects_corruption(corrupt: object) -> None:
    alloc = RangeAllocator(4096, alignment=256)
    corrupt(alloc)  # type: ignore[operator]
    with pytest.raises(InvariantError):
        alloc.check()


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_match_a_byte_map(seed: int) -> None:
    """Against a plain per-granule occupancy map: no range is handed out twice, free bytes agree."""
    rng = random.Random(seed)
    alloc = RangeAllocator(64 * 256 + 100, alignment=256)
    owner = [False] * 64  # one flag per 256-byte granule
    live: list[ByteRange] = []
    for _ in range(300):
        op = rng.random()
        if op < 0.45 or not live:
            r = alloc.allocate(rng.randint(1, 8 * 256))
            if r is not None:
                granules = range(r.offset // 256, r.end // 256)
                assert not any(owner[g] for g in granules)
                for g in granules:
                    owner[g] = True
                live.append(r)
        elif op < 0.75:
            r = live.pop(rng.randrange(len(live)))
            alloc.free(r)
            for g in range(r.offset // 256, r.end // 256):
                owner[g] = False
        else:
            i = rng.randrange(len(live))
            old = live[i]
            new = alloc.try_resize(old, rng.randint(1, 8 * 256))
            if new is not None:
                for g in range(old.offset // 256, old.end // 256):
                    owner[g] = False
                assert not any(owner[g] for g in range(new.offset // 256, new.end // 256))
                for g in range(new.offset // 256, new.end // 256):
                    owner[g] = True
                live[i] = new
        alloc.check()
        assert alloc.free_bytes == owner.count(False) * 256 + 100
        assert sorted(live, key=lambda r: r.offset) == alloc.used_ranges()
