"""An engine built in a partition of the arena: same greedy outputs as an ordinary engine, every tensor a
view of the arena, exact byte accounting, and several models side by side in one arena."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from services.common.sampling import SamplingParams
from services.worker.engine.config import EngineConfig
from services.worker.engine.llm_engine import LLMEngine
from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena
from services.worker.memory.errors import ModelAlreadyResidentError, OutOfMemoryError
from services.worker.memory.manager import MemoryManager
from services.worker.models.errors import CheckpointError
from tests.worker.engine.reference import mixed_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
BLOCK_BYTES = 8192  # 2 layers x 2 KV heads x 16 dims x 16 tokens x (K + V) x 4 bytes, for the tiny models
ARENA_BYTES = 8 * 1024**2


def config(**overrides: object) -> EngineConfig:
    settings: dict[str, object] = {"kv_cache_bytes": 64 * BLOCK_BYTES, "max_num_batched_tokens": 64}
    return EngineConfig(**(settings | overrides))  # type: ignore[arg-type]


def submit(engine: LLMEngine, prompts: list[list[int]]) -> None:
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, GREEDY, detokenize=False)


def run(*engines: LLMEngine) -> list[dict[str, list[int]]]:
    """Step every engine in turn until all are done (interleaved, as a multi-model worker would)."""
    tokens: list[dict[str, list[int]]] = [{} for _ in engines]
    for _ in range(2000):
        busy = [i for i, e in enumerate(engines) if e.has_unfinished_requests()]
        if not busy:
            return tokens
        for i in busy:
            for out in engines[i].step():
                tokens[i].setdefault(out.request_id, []).extend(out.new_token_ids)
    raise AssertionError("engines did not finish")


def generate(engine: LLMEngine, prompts: list[list[int]]) -> dict[str, list[int]]:
    submit(engine, prompts)
    return run(engine)[0]


def tensors_of(engine: LLMEngine) -> dict[str, torch.Tensor]:
    model = engine.loaded.model
    named = itertools.chain(model.named_parameters(), model.named_buffers())
    return dict(named)


def kv_tensors_of(engine: LLMEngine) -> list[torch.Tensor]:
    return [t for pair in engine.runner.kv_caches for t in pair]


def assert_inside(tensor: torch.Tensor, arena: Arena, byte_range: ByteRange) -> None:
    start = tensor.data_ptr() - arena.data_ptr
    assert tensor.untyped_storage().data_ptr() == arena.data_ptr  # the arena's own storage, not a copy
    assert byte_range.offset <= start
    assert start + tensor.numel() * tensor.element_size() <= byte_range.end


@pytest.fixture
def memory() -> MemoryManager:
    return MemoryManager(Arena(ARENA_BYTES))


SHARED = mixed_prompts(1, vocab=512, seed=21, lengths=[40])[0]
CASES = {
    # A shared prefix: later requests hit blocks cached by earlier ones.
    "prefix_caching": (
        [SHARED + t for t in mixed_prompts(8, vocab=512, seed=22, lengths=[3, 30, 60])],
        config(),
    ),
    # 48 blocks are far fewer than 16 prompts of up to 333 tokens need at once (fifo: admission would
    # otherwise avoid preempting).
    "preemption": (
        mixed_prompts(16, vocab=512, seed=7),
        config(kv_cache_bytes=48 * BLOCK_BYTES, enable_prefix_caching=False, policy="fifo"),
    ),
    # Weights, RoPE table and KV pool in bfloat16: the views are typed by the load dtype.
    "bfloat16": (mixed_prompts(6, vocab=512, seed=8), config(dtype="bfloat16")),
    "preemption_with_prefix_caching": (
        [SHARED + t for t in mixed_prompts(16, vocab=512, seed=22, lengths=[3, 60, 150, 250])],
        config(kv_cache_bytes=48 * BLOCK_BYTES, policy="fifo"),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_greedy_outputs_equal_an_ordinary_engine(
    case: str, llama_gqa_dir: Path, memory: MemoryManager
) -> None:
    prompts, cfg = CASES[case]
    alone = LLMEngine(llama_gqa_dir, cfg)
    in_arena = LLMEngine(llama_gqa_dir, cfg, memory=memory, model_name="gqa")
    assert in_arena.layout == alone.layout
    assert generate(in_arena, prompts) == generate(alone, prompts)
    assert in_arena.stats.preemptions == alone.stats.preemptions
    assert in_arena.block_manager.prefix_hit_tokens == alone.block_manager.prefix_hit_tokens
    if "preemption" in case:
        assert in_arena.stats.preemptions > 0
    if "prefix" in case:
        assert in_arena.block_manager.prefix_hit_tokens > 0


@pytest.mark.parametrize("fixture", ["llama_gqa_dir", "llama_tied_dir"])
def test_every_tensor_is_a_view_of_its_partition(
    fixture: str, request: pytest.FixtureRequest, memory: MemoryManager
) -> None:
    model_dir = request.getfixturevalue(fixture)
    engine = LLMEngine(model_dir, config(), memory=memory, model_name="m")
    part = memory.partition("m")
    assert engine.partition == part and part.kv is not None
    tensors = tensors_of(engine)
    for tensor in tensors.values():
        assert_inside(tensor, memory.arena, part.weights)
    for tensor in kv_tensors_of(engine):
        assert_inside(tensor, memory.arena, part.kv)
    # Tied embeddings are one tensor, counted once; the slot holds exactly the distinct tensors (padded
    # only to each tensor's 256-byte alignment).
    model = engine.loaded.model
    if engine.model_config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    distinct = sum(t.numel() * t.element_size() for t in tensors.values())
    assert distinct <= part.weight_bytes < distinct + 256 * (len(tensors) + 1)
    assert part.kv_bytes == engine.layout.kv_cache_bytes


def test_serving_allocates_nothing_and_usage_shows_the_model(
    llama_gqa_dir: Path, memory: MemoryManager
) -> None:
    engine = LLMEngine(llama_gqa_dir, config(), memory=memory, model_name="gqa")
    arena_ptr = memory.arena.data_ptr
    pointers = {name: t.data_ptr() for name, t in tensors_of(engine).items()}
    kv_pointers = [t.data_ptr() for t in kv_tensors_of(engine)]
    generate(engine, mixed_prompts(6, vocab=512, seed=3))
    assert memory.arena.data_ptr == arena_ptr
    assert {name: t.data_ptr() for name, t in tensors_of(engine).items()} == pointers
    assert [t.data_ptr() for t in kv_tensors_of(engine)] == kv_pointers
    usage = memory.usage()["gqa"]
    assert usage.kv_bytes == engine.layout.kv_cache_bytes == 64 * BLOCK_BYTES
    assert usage.weight_bytes >= sum(t.numel() * t.element_size() for t in tensors_of(engine).values())
    assert memory.free_bytes == ARENA_BYTES - usage.total_bytes


def test_two_models_share_one_arena(llama_gqa_dir: Path, qwen2_dir: Path, memory: MemoryManager) -> None:
    prompts = mixed_prompts(6, vocab=512, seed=5)
    expected = [generate(LLMEngine(d, config()), prompts) for d in (llama_gqa_dir, qwen2_dir)]
    gqa = LLMEngine(llama_gqa_dir, config(), memory=memory, model_name="gqa")
    qwen = LLMEngine(qwen2_dir, config(), memory=memory, model_name="qwen")
    a, b = memory.partition("gqa"), memory.partition("qwen")
    assert not any(x.overlaps(y) for x in a.ranges() for y in b.ranges())
    memory.check()
    submit(gqa, prompts)
    submit(qwen, prompts)
    assert run(gqa, qwen) == expected  # steps of the two models interleaved
    with pytest.raises(ModelAlreadyResidentError):
        LLMEngine(qwen2_dir, config(), memory=memory, model_name="qwen")
    assert memory.partition("qwen") == b


def test_a_released_partition_is_reused(llama_gqa_dir: Path, qwen2_dir: Path, llama_tied_dir: Path) -> None:
    prompts = mixed_prompts(4, vocab=512, seed=9)
    probe = MemoryManager(Arena(ARENA_BYTES))
    LLMEngine(llama_gqa_dir, config(), memory=probe, model_name="probe")
    one_model = probe.partition("probe").nbytes
    # Room for two models and not three: the third fits only in the space the first gives back.
    memory = MemoryManager(Arena(2 * one_model + one_model // 2))
    LLMEngine(llama_gqa_dir, config(), memory=memory, model_name="gqa")
    qwen = LLMEngine(qwen2_dir, config(), memory=memory, model_name="qwen")
    with pytest.raises(OutOfMemoryError):
        LLMEngine(llama_tied_dir, config(), memory=memory, model_name="tied")
    assert "tied" not in memory
    freed = memory.release("gqa")
    tied = LLMEngine(llama_tied_dir, config(), memory=memory, model_name="tied")
    memory.check()
    assert memory.partition("tied").weights.offset == freed.weights.offset
    expected_tied = generate(LLMEngine(llama_tied_dir, config()), prompts)
    expected_qwen = generate(LLMEngine(qwen2_dir, config()), prompts)
    submit(tied, prompts)
    submit(qwen, prompts)
    assert run(tied, qwen) == [expected_tied, expected_qwen]


def test_a_corrupt_checkpoint_leaves_no_partition(
    llama_gqa_dir: Path, tmp_path: Path, memory: MemoryManager
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in llama_gqa_dir.iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError):
        LLMEngine(broken, config(), memory=memory, model_name="broken")
    assert "broken" not in memory
    assert memory.free_bytes == ARENA_BYTES


def test_the_engine_must_run_on_the_arena_device(llama_gqa_dir: Path) -> None:
    memory = MemoryManager(Arena(ARENA_BYTES, device="meta"))
    with pytest.raises(ValueError, match="arena"):
        LLMEngine(llama_gqa_dir, config(), memory=memory)
