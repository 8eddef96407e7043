"""The worker's models in one arena (ModelHost): least-recently-used eviction when a load needs room,
never of a model with requests in flight unless configured, reload from the host copy without the
checkpoint, a load that cannot fit refused while the resident models keep serving, and byte accounting
checked after every change. Real tiny checkpoints and engines; no gRPC (test_multi_model.py has it)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.errors import NotFound, ResourceExhausted
from services.common.sampling import SamplingParams
from services.worker.engine.llm import LLM
from services.worker.models.synthetic import make_decoder_checkpoint
from services.worker.server.config import WorkerSettings
from services.worker.server.host import ModelHost

SPEC = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_layers": 2}
KV_BYTES = 256 << 10  # 32 blocks of 16 tokens: a small pool, so partitions are mostly weights
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPT = [5, 17, 42, 99, 7]


@pytest.fixture(scope="module")
def same_size_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three distinct decoders of one architecture (different seeds): equal partitions, so evicting any
    one of them makes room for any other."""
    root = tmp_path_factory.mktemp("host-models")
    return {name: make_decoder_checkpoint(root / name, **SPEC, seed=seed) for seed, name in enumerate("abc")}


def settings(models: dict[str, Path], arena_bytes: int, **overrides: object) -> WorkerSettings:
    # float32, as LLM() below: the worker's "auto" is bfloat16 wherever that measures faster.
    overrides.setdefault("dtype", "float32")
    return WorkerSettings(
        models=models, arena_bytes=arena_bytes, kv_cache_bytes=KV_BYTES, max_num_seqs=4, **overrides
    )  # type: ignore[arg-type]


async def partition_bytes(models: dict[str, Path]) -> dict[str, int]:
    """Arena bytes each model takes, measured by loading it into a roomy arena."""
    host = ModelHost(settings(models, 256 << 20))
    try:
        for name in models:
            await host.load(name)
        assert host.memory is not None
        return {name: usage.total_bytes for name, usage in host.memory.usage().items()}
    finally:
        await host.close()


async def greedy(host: ModelHost, name: str) -> list[int]:
    out = [o async for o in host.generator(name).generate(PROMPT, GREEDY)]
    return [t for o in out for t in o.new_token_ids]


@pytest.fixture
async def two_fit(same_size_models: dict[str, Path]) -> AsyncIterator[ModelHost]:
    """A host whose arena holds any two of the three models, not all three."""
    size = max((await partition_bytes(same_size_models)).values())
    host = ModelHost(settings(same_size_models, 2 * size + size // 2))
    yield host
    await host.close()


async def test_a_load_that_needs_room_evicts_the_least_recently_used_idle_model(two_fit: ModelHost) -> None:
    host = two_fit
    await host.load("a")
    await host.load("b")
    expected_a = await greedy(host, "a")  # a is now used more recently than b
    served, _ = await host.load("c")
    assert set(host.models) == {"a", "c"}
    assert list(host.host_copies) == ["b"] and host.evictions == {"request": 0, "lru": 1}
    assert served.source == "disk"
    assert host.memory is not None
    host.memory.check()
    assert await greedy(host, "a") == expected_a  # the model that stayed kept serving, unchanged
    with pytest.raises(NotFound, match="evicted"):
        host.generator("b")


async def test_a_model_with_requests_in_flight_is_never_evicted(two_fit: ModelHost) -> None:
    host = two_fit
    await host.load("a")
    await host.load("b")
    llm = host.generator("a")
    stream = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    await anext(stream)  # a's request is running
    host.generator("b")  # b used more recently than a: LRU alone would pick a
    async with llm.paused():  # a's engine holds between steps, so its request stays in flight
        await host.load("c")
    assert set(host.models) == {"a", "c"}, "the idle b goes, although a was used less recently"
    rest = [o async for o in stream]
    assert rest[-1].finished and rest[-1].finish_reason == "length"


async def test_evict_busy_setting_lets_a_load_abort_the_least_recently_used(
    same_size_models: dict[str, Path],
) -> None:
    size = max((await partition_bytes(same_size_models)).values())
    host = ModelHost(settings(same_size_models, 2 * size + size // 2, evict_busy=True))
    try:
        await host.load("a")
        await host.load("b")
        stream = host.generator("a").generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=500))
        await anext(stream)
        host.generator("b")
        await host.load("c")
        assert set(host.models) == {"b", "c"}
        rest = [o async for o in stream]
        assert rest == [] or rest[-1].finish_reason == "abort"  # cut off, not lost silently
    finally:
        await host.close()


async def test_reload_comes_from_the_host_copy_without_the_checkpoint(
    same_size_models: dict[str, Path], tmp_path: Path
) -> None:
    movable = shutil.copytree(same_size_models["a"], tmp_path / "a")
    host = ModelHost(settings({"a": movable}, 64 << 20))
    try:
        await host.load("a")
        before = await greedy(host, "a")
        assert await host.evict("a", force=False) == 0
        assert host.memory is not None and host.memory.usage() == {}
        shutil.rmtree(movable)  # a reload that read the checkpoint would fail now
        served, _ = await host.load("a")
        assert served.source == "host_copy" and not host.host_copies
        assert (
            await greedy(host, "a")
            == before
            == LLM(same_size_models["a"]).generate([PROMPT], GREEDY)[0].token_ids
        )
        host.memory.check()
    finally:
        await host.close()


async def test_a_model_too_big_for_the_arena_is_refused_and_the_others_keep_serving(
    same_size_models: dict[str, Path], tmp_path: Path
) -> None:
    big = make_decoder_checkpoint(tmp_path / "big", **{**SPEC, "hidden_size": 256, "intermediate_size": 1024})
    size = max((await partition_bytes(same_size_models)).values())
    host = ModelHost(settings({**same_size_models, "big": big}, 2 * size + size // 2))
    try:
        await host.load("a")
        expected = await greedy(host, "a")
        with pytest.raises(ResourceExhausted, match="does not fit even after evicting every idle model"):
            await host.load("big")
        assert set(host.models) == {"a"} and not host.host_copies, "nothing evicted for a hopeless load"
        assert await greedy(host, "a") == expected
        assert host.memory is not None
        host.memory.check()
    finally:
        await host.close()


async def test_no_arena_when_its_size_is_zero(same_size_models: dict[str, Path]) -> None:
    host = ModelHost(settings(same_size_models, 0))
    try:
        await host.load("a")
        assert host.memory is None
        assert await greedy(host, "a") == LLM(same_size_models["a"]).generate([PROMPT], GREEDY)[0].token_ids
    finally:
        await host.close()


async def test_a_decoder_short_of_kv_takes_blocks_from_an_idle_one(same_size_models: dict[str, Path]) -> None:
    small_pool = 8 * 8192  # 8 blocks of 16 tokens: 128 tokens for 8 requests wanting 60 each
    config = WorkerSettings(
        models=same_size_models, arena_bytes=64 << 20, kv_cache_bytes=small_pool, max_num_seqs=8,
        kv_donor_min_blocks=2, dtype="float32",  # float32, as LLM() below; and 8 blocks, not bfloat16's 16
    )  # fmt: skip
    host = ModelHost(config)
    try:
        await host.load("a")
        await host.load("b")  # idle donor
        taker = host.generator("a")
        prompts = [[3 + i, 40 + i, 7, 9] * 5 for i in range(8)]
        params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

        async def run(prompt: list[int]) -> list[int]:
            return [t async for o in taker.generate(prompt, params) for t in o.new_token_ids]

        tasks = [asyncio.create_task(run(p)) for p in prompts]
        while await taker.call(lambda engine: len(engine.scheduler.unfinished())) < len(prompts):
            await asyncio.sleep(0)  # let the adds reach the engine thread
        blocks_before = taker.engine.layout.num_kv_blocks
        moved = await host.rebalance_kv()
        outputs = await asyncio.gather(*tasks)
        assert moved > 0 and host.kv_bytes_moved == moved
        assert taker.engine.layout.num_kv_blocks > blocks_before
        assert host.generator("b").engine.layout.num_kv_blocks >= 2
        assert host.memory is not None
        host.memory.check()
        alone = LLM(same_size_models["a"]).generate(prompts, params)
        assert outputs == [c.token_ids for c in alone]
        assert await greedy(host, "b") == LLM(same_size_models["b"]).generate([PROMPT], GREEDY)[0].token_ids
    finally:
        await host.close()


async def test_a_busy_model_does_not_starve_another(same_size_models: dict[str, Path]) -> None:
    host = ModelHost(settings(same_size_models, 64 << 20))
    try:
        await host.load("a")
        await host.load("b")
        busy = host.generator("a")
        flood = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
        finished_a: list[float] = []

        async def run_a(i: int) -> None:
            async for _ in busy.generate([3 + i, 9, 27], flood):
                pass
            finished_a.append(asyncio.get_running_loop().time())

        tasks = [asyncio.create_task(run_a(i)) for i in range(8)]
        await asyncio.sleep(0)
        tokens_b = await greedy(host, "b")  # each model steps on its own engine thread
        b_done = asyncio.get_running_loop().time()
        await asyncio.gather(*tasks)
        assert tokens_b == LLM(same_size_models["b"]).generate([PROMPT], GREEDY)[0].token_ids
        assert b_done < min(finished_a), "b's short request waited for a's flood to drain"
    finally:
        await host.close()
