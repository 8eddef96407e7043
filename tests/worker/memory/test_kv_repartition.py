"""KV repartitioning: a model under pressure takes KV blocks from an idle one in the same arena, with no
reload: exact byte accounting, greedy outputs equal to an undisturbed run whether the taker's pool grew
in place (KV kept) or moved (recomputed), and refusals that change nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from services.common.sampling import SamplingParams
from services.worker.engine import kv_cache
from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.block_manager import BlockManager, BlocksInUseError
from services.worker.engine.kv_cache import KVCacheSpec, kv_cache_views, relayout_kv_pool
from services.worker.engine.kv_repartition import kv_bytes_to_move, move_kv_blocks
from services.worker.engine.llm_engine import LLMEngine
from services.worker.engine.sequence import Sequence
from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena
from services.worker.memory.errors import ModelBusyError
from services.worker.memory.manager import MemoryManager
from tests.worker.engine.reference import mixed_prompts
from tests.worker.memory.test_engine_in_arena import (
    ARENA_BYTES,
    BLOCK_BYTES,
    GREEDY,
    config,
    generate,
    run,
    submit,
)

PROMPTS = mixed_prompts(4, vocab=512, seed=41, lengths=[30, 45, 9, 20])
SMALL = config(kv_cache_bytes=8 * BLOCK_BYTES, enable_prefix_caching=False)
IDLE = config(kv_cache_bytes=48 * BLOCK_BYTES)


@pytest.fixture
def memory() -> MemoryManager:
    return MemoryManager(Arena(ARENA_BYTES))


def check_disjoint(memory: MemoryManager) -> None:
    memory.check()
    ranges = [r for part in memory._partitions.values() for r in part.ranges()]
    assert not any(a.overlaps(b) for i, a in enumerate(ranges) for b in ranges[i + 1 :])


def step_until_decoding(engine: LLMEngine) -> dict[str, list[int]]:
    """Step until every request has its prompt in the cache and decodes (so its KV is at stake); the
    tokens generated so far."""
    tokens: dict[str, list[int]] = {}
    for _ in range(50):
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if engine.scheduler.num_waiting == 0 and all(
            s.num_computed_tokens >= s.num_prompt_tokens for s in engine.scheduler._running
        ):
            return tokens
    raise AssertionError("requests never all started decoding")


def finish(engine: LLMEngine, so_far: dict[str, list[int]]) -> dict[str, list[int]]:
    """Run engine to the end; every request's tokens, so_far first."""
    rest = run(engine)[0]
    return {rid: so_far.get(rid, []) + rest.get(rid, []) for rid in so_far.keys() | rest.keys()}


# --- BlockManager and relayout, no model ----------------------------------------------------------------


def seq_of(request_id: str, num_tokens: int) -> Sequence:
    return Sequence(request_id, list(range(3, 3 + num_tokens)), GREEDY)


def test_block_manager_resize() -> None:
    bm = BlockManager(8, 4)
    held, cached = seq_of("held", 8), seq_of("cached", 16)
    assert bm.allocate(held, 8) and bm.allocate(cached, 16)  # ids 0-1 and 2-5
    cached.num_computed_tokens = 16
    bm.commit(cached)
    bm.free(cached)  # ids 2-5: cached, evictable
    bm.resize(12)
    assert bm.num_blocks == 12 and bm.num_free_blocks == 10 and bm.num_cached_blocks == 4
    bm.resize(4)  # drops ids 4-11: free, or only cached (ids 4 and 5 lose their cache entries)
    assert bm.num_free_blocks == 2 and bm.num_cached_blocks == 2 and bm.num_used_blocks == 2
    with pytest.raises(BlocksInUseError):
        bm.resize(1)  # id 1 is held
    assert bm.num_blocks == 4 and bm.refcount(1) == 1
    with pytest.raises(BlocksInUseError):
        bm.clear()
    bm.free(held)
    bm.clear()
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 0
    grabbed = seq_of("all", 16)
    assert bm.allocate(grabbed, 16) and sorted(grabbed.block_table) == [0, 1, 2, 3]


@pytest.mark.parametrize(("old", "new"), [(5, 9), (9, 5), (6, 6), (3, 4)])
def test_relayout_keeps_the_kept_blocks(old: int, new: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_cache, "_MOVE_PIECE_BYTES", 96)  # many pieces, some overlapping their source
    spec = KVCacheSpec(num_layers=3, num_kv_heads=2, head_dim=4, block_size=2, dtype=torch.float32)
    arena = Arena(16 * spec.bytes_per_block)
    pool = ByteRange(spec.bytes_per_block, max(old, new) * spec.bytes_per_block)
    before = kv_cache_views(arena, pool, spec, old)
    for layer, (k, v) in enumerate(before):
        for block in range(old):
            k[block] = 100 * layer + block
            v[block] = -100 * layer - block
    after = relayout_kv_pool(arena, pool, spec, old, new)
    for layer, (k, v) in enumerate(after):
        assert k.shape[0] == new
        for block in range(new):
            expected = 100 * layer + block if block < old else 0
            assert torch.all(k[block] == expected) and torch.all(v[block] == -expected)


# --- engines moved by hand: memory.move_kv, then rebind_kv ----------------------------------------------


def test_grow_in_place_keeps_running_requests(llama_gqa_dir: Path, memory: MemoryManager) -> None:
    expected = generate(LLMEngine(llama_gqa_dir, SMALL), PROMPTS)
    donor = LLMEngine(llama_gqa_dir, IDLE, memory=memory, model_name="donor")
    taker = LLMEngine(llama_gqa_dir, SMALL, memory=memory, model_name="taker")  # last: free bytes follow
    submit(taker, PROMPTS)
    so_far = step_until_decoding(taker)
    pool = memory.partition("taker").kv
    memory.move_kv("donor", "taker", 16 * BLOCK_BYTES)
    check_disjoint(memory)
    assert memory.partition("taker").kv.offset == pool.offset  # type: ignore[union-attr]
    donor.rebind_kv()
    taker.rebind_kv()
    assert taker.layout.num_kv_blocks == 24 and taker.block_manager.num_blocks == 24
    assert donor.layout.num_kv_blocks == 32 and taker.layout.kv_cache_bytes == 24 * BLOCK_BYTES
    assert taker.partition == memory.partition("taker")
    assert finish(taker, so_far) == expected
    assert taker.stats.preemptions == 0  # the KV in the pool was kept, not recomputed
    assert generate(donor, PROMPTS) == expected  # the shrunk donor still serves


def test_a_moved_pool_recomputes_with_the_same_outputs(llama_gqa_dir: Path, memory: MemoryManager) -> None:
    expected = generate(LLMEngine(llama_gqa_dir, SMALL), PROMPTS)
    taker = LLMEngine(llama_gqa_dir, SMALL, memory=memory, model_name="taker")  # the donor's slot follows
    donor = LLMEngine(llama_gqa_dir, IDLE, memory=memory, model_name="donor")
    submit(taker, PROMPTS)
    so_far = step_until_decoding(taker)
    pool = memory.partition("taker").kv
    memory.move_kv("donor", "taker", 16 * BLOCK_BYTES)
    check_disjoint(memory)
    assert memory.partition("taker").kv.offset != pool.offset  # type: ignore[union-attr]
    donor.rebind_kv()
    taker.rebind_kv()
    assert taker.stats.preemptions == len(PROMPTS) and taker.block_manager.num_used_blocks == 0
    assert all(
        t.data_ptr() >= memory.arena.data_ptr + memory.partition("taker").kv.offset  # type: ignore[union-attr]
        for pair in taker.runner.kv_caches
        for t in pair
    )
    assert finish(taker, so_far) == expected
    assert generate(donor, PROMPTS) == expected


def test_shrinking_below_held_blocks_is_refused(llama_gqa_dir: Path, memory: MemoryManager) -> None:
    cfg = config(kv_cache_bytes=16 * BLOCK_BYTES, enable_prefix_caching=False)
    expected = generate(LLMEngine(llama_gqa_dir, cfg), PROMPTS)
    engine = LLMEngine(llama_gqa_dir, cfg, memory=memory, model_name="m")
    submit(engine, PROMPTS)
    so_far = step_until_decoding(engine)
    held = engine.block_manager.num_used_blocks
    with pytest.raises(BlocksInUseError):
        engine.shrink_kv(held - 1)
    assert engine.layout.num_kv_blocks == 16
    # The manager shrinks first: rebind_kv refuses, and giving the bytes back leaves the engine intact.
    memory.resize_kv("m", 15 * BLOCK_BYTES)
    with pytest.raises(BlocksInUseError):
        engine.rebind_kv()
    memory.resize_kv("m", 16 * BLOCK_BYTES)
    engine.rebind_kv()
    assert finish(engine, so_far) == expected and engine.stats.preemptions == 0


def test_shrink_kv_keeps_running_requests(llama_gqa_dir: Path, memory: MemoryManager) -> None:
    cfg = config(kv_cache_bytes=16 * BLOCK_BYTES, enable_prefix_caching=False)
    expected = generate(LLMEngine(llama_gqa_dir, cfg), PROMPTS)
    engine = LLMEngine(llama_gqa_dir, cfg, memory=memory, model_name="m")
    submit(engine, PROMPTS)
    so_far = step_until_decoding(engine)
    engine.shrink_kv(12)  # the held blocks are ids 0-7: compact, then give the tail away
    memory.resize_kv("m", 12 * BLOCK_BYTES)
    engine.rebind_kv()
    check_disjoint(memory)
    assert engine.layout.num_kv_blocks == 12 and memory.partition("m").kv_bytes == 12 * BLOCK_BYTES
    assert finish(engine, so_far) == expected and engine.stats.preemptions == 0


# --- AsyncLLM: call, paused, and the orchestrator -------------------------------------------------------


async def test_call_and_paused(llama_gqa_dir: Path) -> None:
    engine = LLMEngine(llama_gqa_dir, config())
    long = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    async with AsyncLLM(engine) as llm:
        assert await llm.call(lambda e: e.layout.num_kv_blocks) == 64
        with pytest.raises(ZeroDivisionError):
            await llm.call(lambda e: 1 // 0)
        stream = llm.generate(PROMPTS[0], long)
        await anext(stream)
        async with llm.paused() as held:
            steps = engine.stats.steps
            await asyncio.sleep(0.05)
            assert engine.stats.steps == steps  # held: no step ran
            assert await held.call(lambda e: e.scheduler.num_running) == 1
        tokens = [t async for out in stream for t in out.new_token_ids]
        assert engine.stats.steps > steps and len(tokens) == 59


async def test_a_busy_donor_is_refused_and_nothing_changes(
    llama_gqa_dir: Path, memory: MemoryManager
) -> None:
    donor_engine = LLMEngine(llama_gqa_dir, IDLE, memory=memory, model_name="donor")
    taker_engine = LLMEngine(llama_gqa_dir, SMALL, memory=memory, model_name="taker")
    usage = memory.usage()
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    async with AsyncLLM(donor_engine) as donor, AsyncLLM(taker_engine) as taker:
        stream = donor.generate(PROMPTS[1], long)
        await anext(stream)
        with pytest.raises(ModelBusyError):
            await move_kv_blocks(donor, taker, 8 * BLOCK_BYTES)
        assert memory.usage() == usage and donor_engine.layout.num_kv_blocks == 48
        await stream.aclose()
    memory.check()


async def test_a_taker_under_pressure_takes_blocks_from_an_idle_donor(
    llama_gqa_dir: Path, memory: MemoryManager
) -> None:
    prompts = mixed_prompts(10, vocab=512, seed=43, lengths=[40, 70, 25, 55])
    expected = generate(LLMEngine(llama_gqa_dir, SMALL), prompts)
    taker_engine = LLMEngine(llama_gqa_dir, SMALL, memory=memory, model_name="taker")
    donor_engine = LLMEngine(llama_gqa_dir, IDLE, memory=memory, model_name="donor")
    async with AsyncLLM(donor_engine) as donor, AsyncLLM(taker_engine) as taker:

        async def collect(i: int, prompt: list[int]) -> tuple[str, list[int]]:
            tokens = [t async for out in taker.generate(prompt, GREEDY, f"r{i}") for t in out.new_token_ids]
            return f"r{i}", tokens

        tasks = [asyncio.create_task(collect(i, p)) for i, p in enumerate(prompts)]
        await asyncio.sleep(0)  # let every add reach the engine's queue
        async with donor.paused() as held_donor, taker.paused() as held_taker:
            nbytes = kv_bytes_to_move(held_taker.engine, held_donor.engine, min_donor_blocks=4)
        assert nbytes > 0 and nbytes % BLOCK_BYTES == 0
        donor_blocks, taker_blocks = await move_kv_blocks(donor, taker, nbytes)
        assert taker_blocks == 8 + nbytes // BLOCK_BYTES and donor_blocks == 48 - nbytes // BLOCK_BYTES
        check_disjoint(memory)
        assert dict(await asyncio.gather(*tasks)) == expected
        # The donor is whole and still serves after giving blocks away.
        out = [t async for o in donor.generate(prompts[0], GREEDY) for t in o.new_token_ids]
        assert out == expected["r0"]
    assert kv_bytes_to_move(taker_engine, donor_engine) == 0  # no request left: no shortfall
