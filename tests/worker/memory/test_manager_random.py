"""A seeded random mix of reserve / release / resize_kv / move_kv / touch: the accounting always holds.

Each model's bytes are also filled with its own value through arena views, so an operation that wrote
(or handed out) bytes of another model, or moved a range it claimed to keep, shows up as wrong bytes.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena
from services.worker.memory.errors import OutOfMemoryError
from services.worker.memory.manager import MemoryManager
from services.worker.memory.partition import Partition, PartitionUsage

ALIGN = 256
ARENA_BYTES = 64 * ALIGN + 123  # a ragged tail that can never be handed out
MODELS = [f"m{i}" for i in range(6)]


def _bytes(arena: Arena, byte_range: ByteRange) -> torch.Tensor:
    return arena.view(byte_range, torch.uint8, (byte_range.nbytes,))


def _fill(arena: Arena, part: Partition) -> None:
    value = MODELS.index(part.model) + 1
    for byte_range in part.ranges():
        _bytes(arena, byte_range).fill_(value)


def _holds(arena: Arena, byte_range: ByteRange, value: int) -> bool:
    return bool((_bytes(arena, byte_range) == value).all())


def _check_accounting(manager: MemoryManager) -> None:
    manager.check()
    parts = [manager.partition(m) for m in manager.usage()]
    ranges = [r for p in parts for r in p.ranges()]
    for a, b in itertools.combinations(ranges, 2):
        assert not a.overlaps(b)
    for r in ranges:
        assert r.offset % ALIGN == 0 and r.nbytes % ALIGN == 0 and r.end <= ARENA_BYTES
    assert sum(p.nbytes for p in parts) + manager.free_bytes == ARENA_BYTES
    assert manager.usage() == {p.model: PartitionUsage(p.weight_bytes, p.kv_bytes) for p in parts}


def _random_op(manager: MemoryManager, rng: random.Random) -> None:
    resident = list(manager.usage())
    model = rng.choice(MODELS)
    op = rng.random()
    if model not in manager:
        manager.reserve(model, rng.randint(1, 12 * ALIGN), rng.choice([0, rng.randint(1, 12 * ALIGN)]))
    elif op < 0.2:
        manager.release(model)
    elif op < 0.5:
        manager.resize_kv(model, rng.choice([0, rng.randint(1, 16 * ALIGN)]))
    elif op < 0.8 and len(resident) > 1:
        donor = rng.choice([m for m in resident if m != model])
        held = manager.partition(donor).kv_bytes
        if held:
            manager.move_kv(donor, model, rng.randint(1, held))
    else:
        manager.touch(model)


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_keep_the_accounting(seed: int) -> None:
    rng = random.Random(seed)
    arena = Arena(ARENA_BYTES)
    manager = MemoryManager(arena, alignment=ALIGN)
    ptr = arena.data_ptr
    failures = 0
    for _ in range(400):
        before = {m: manager.partition(m) for m in manager.usage()}
        free_before = manager.free_bytes
        try:
            _random_op(manager, rng)
        except OutOfMemoryError as err:
            failures += 1
            assert err.needed > err.largest_free  # it really did not fit in one hole
            assert {m: manager.partition(m) for m in manager.usage()} == before  # a failure changes nothing
            assert manager.free_bytes == free_before
        after = {m: manager.partition(m) for m in manager.usage()}
        for model, old in before.items():
            new = after.get(model)
            if new is None:
                continue
            value = MODELS.index(model) + 1
            assert new.weights == old.weights  # weights never move
            assert _holds(arena, new.weights, value)
            if old.kv is not None and new.kv is not None and new.kv.offset == old.kv.offset:
                # A pool that kept its offset kept its bytes, up to the smaller of the two sizes.
                kept = ByteRange(new.kv.offset, min(old.kv.nbytes, new.kv.nbytes))
                assert _holds(arena, kept, value)
        _check_accounting(manager)
        for part in after.values():
            _fill(arena, part)
        assert (arena.data_ptr, arena.total_bytes) == (ptr, ARENA_BYTES)
    assert failures > 0  # the sizes are chosen so the arena does run out, exercising the undo paths
    lru = manager.eviction_candidates(set())
    assert sorted(lru) == sorted(manager.usage())
