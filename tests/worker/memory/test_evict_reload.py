"""Evicting an engine's model to a host copy and rebuilding it from that copy: same greedy outputs, no
checkpoint read, exact byte accounting, and in-flight requests refused or aborted as asked."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from services.worker.engine.llm_engine import LLMEngine
from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena
from services.worker.memory.errors import (
    HostCopyMismatchError,
    ModelAlreadyResidentError,
    ModelBusyError,
    ModelEvictedError,
    OutOfMemoryError,
)
from services.worker.memory.host_copy import HostCopy
from services.worker.memory.manager import MemoryManager
from tests.worker.engine.reference import mixed_prompts
from tests.worker.memory.test_engine_in_arena import (
    ARENA_BYTES,
    GREEDY,
    config,
    generate,
    run,
    submit,
    tensors_of,
)

PROMPTS = mixed_prompts(6, vocab=512, seed=31)


@pytest.fixture
def memory() -> MemoryManager:
    return MemoryManager(Arena(ARENA_BYTES))


def slot_bytes(memory: MemoryManager, model: str, nbytes: int) -> torch.Tensor:
    """A copy of the first nbytes of model's weights slot."""
    weights = memory.partition(model).weights
    return memory.arena.view(ByteRange(weights.offset, nbytes), torch.uint8, (nbytes,)).clone()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reload_from_host_gives_the_same_outputs_without_the_checkpoint(
    dtype: str, llama_gqa_dir: Path, tmp_path: Path, memory: MemoryManager
) -> None:
    # A private copy of the checkpoint, deleted before the reload: nothing may be read from disk.
    model_dir = tmp_path / "model"
    shutil.copytree(llama_gqa_dir, model_dir)
    cfg = config(dtype=dtype)
    engine = LLMEngine(model_dir, cfg, memory=memory, model_name="gqa")
    before = generate(engine, PROMPTS)
    usage = memory.usage()["gqa"]
    host = engine.evict()
    assert isinstance(host, HostCopy) and host.model == "gqa" and not host.pinned
    assert memory.usage() == {} and memory.free_bytes == ARENA_BYTES
    memory.check()
    shutil.rmtree(model_dir)

    reloaded = LLMEngine(host, cfg, memory=memory)
    assert reloaded.model_name == "gqa" and memory.usage() == {"gqa": usage}
    memory.check()
    assert reloaded.layout == engine.layout
    assert generate(reloaded, PROMPTS) == before


def test_reload_lands_elsewhere_after_another_model_used_the_space(
    llama_gqa_dir: Path, qwen2_dir: Path
) -> None:
    probe = MemoryManager(Arena(ARENA_BYTES))
    LLMEngine(llama_gqa_dir, config(), memory=probe, model_name="probe")
    one_model = probe.partition("probe").nbytes
    # Room for two models and not three: while qwen holds the evicted model's old bytes, the reload
    # must land in the rest.
    memory = MemoryManager(Arena(2 * one_model + one_model // 2))
    gqa = LLMEngine(llama_gqa_dir, config(), memory=memory, model_name="gqa")
    before = generate(gqa, PROMPTS)
    old = memory.partition("gqa")
    host = gqa.evict()
    assert host is not None
    qwen = LLMEngine(qwen2_dir, config(), memory=memory, model_name="qwen")
    assert memory.partition("qwen").weights.offset == old.weights.offset

    reloaded = LLMEngine(host, config(), memory=memory, model_name="gqa")
    new = memory.partition("gqa")
    assert new.weights.offset != old.weights.offset
    assert not any(a.overlaps(b) for a in new.ranges() for b in memory.partition("qwen").ranges())
    memory.check()
    expected_qwen = generate(LLMEngine(qwen2_dir, config()), PROMPTS)
    submit(reloaded, PROMPTS)
    submit(qwen, PROMPTS)
    assert run(reloaded, qwen) == [before, expected_qwen]  # interleaved with the model in its old place


def test_host_copy_holds_the_slot_bytes(llama_tied_dir: Path, memory: MemoryManager) -> None:
    engine = LLMEngine(llama_tied_dir, config(), memory=memory, model_name="tied")
    generate(engine, PROMPTS)  # serving must not have changed the weights either
    slot = memory.partition("tied").weights
    distinct = sum(t.numel() * t.element_size() for t in tensors_of(engine).values())
    at_eviction = slot_bytes(memory, "tied", slot.nbytes)
    host = engine.evict()
    assert host is not None
    assert distinct <= host.nbytes <= slot.nbytes
    assert torch.equal(host.weights, at_eviction[: host.nbytes])
    reloaded = LLMEngine(host, config(), memory=memory)
    assert torch.equal(slot_bytes(memory, "tied", host.nbytes), host.weights)
    # Tied embeddings stay one tensor after the rebind.
    model = reloaded.loaded.model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_evict_with_requests_in_flight_refuses(llama_gqa_dir: Path, memory: MemoryManager) -> None:
    expected = generate(LLMEngine(llama_gqa_dir, config()), PROMPTS)
    engine = LLMEngine(llama_gqa_dir, config(), memory=memory, model_name="gqa")
    submit(engine, PROMPTS)
    first = {out.request_id: list(out.new_token_ids) for out in engine.step()}
    partition = memory.partition("gqa")
    with pytest.raises(ModelBusyError) as caught:
        engine.evict()
    assert caught.value.num_requests == len(PROMPTS) and caught.value.model == "gqa"
    assert memory.partition("gqa") == partition
    # Nothing changed: the requests finish with the outputs they would have had.
    rest = run(engine)[0]
    assert {rid: first.get(rid, []) + rest[rid] for rid in rest} == expected
    assert engine.evict() is not None  # drained: now it goes


def test_evict_with_abort_frees_everything(llama_gqa_dir: Path, memory: MemoryManager) -> None:
    engine = LLMEngine(llama_gqa_dir, config(), memory=memory, model_name="gqa")
    before = generate(engine, PROMPTS)
    submit(engine, PROMPTS)
    engine.step()
    engine.step()
    assert engine.block_manager.num_used_blocks > 0
    host = engine.evict(abort_running=True)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_used_blocks == 0
    assert memory.usage() == {} and memory.free_bytes == ARENA_BYTES
    memory.check()
    with pytest.raises(ModelEvictedError, match="gqa"):
        engine.step()
    with pytest.raises(ModelEvictedError):
        engine.add_request("late", PROMPTS[0], GREEDY)
    with pytest.raises(ModelEvictedError):
        engine.evict()
    assert host is not None
    assert generate(LLMEngine(host, config(), memory=memory), PROMPTS) == before


def test_evict_without_a_host_copy(llama_gqa_dir: Path, memory: MemoryManager) -> None:
    engine = LLMEngine(llama_gqa_dir, config(), memory=memory, model_name="gqa")
    assert engine.evict(keep_host_copy=False) is None
    assert memory.free_bytes == ARENA_BYTES
    memory.check()


def test_reload_errors_leave_the_arena_as_it_was(
    llama_gqa_dir: Path, qwen2_dir: Path, memory: MemoryManager
) -> None:
    host = LLMEngine(llama_gqa_dir, config(), memory=memory, model_name="gqa").evict()
    assert host is not None
    with pytest.raises(ValueError, match="arena"):
        LLMEngine(host, config())
    with pytest.raises(ValueError, match="bfloat16"):
        LLMEngine(host, config(dtype="bfloat16"), memory=memory)
    LLMEngine(qwen2_dir, config(), memory=memory, model_name="gqa")
    with pytest.raises(ModelAlreadyResidentError):
        LLMEngine(host, config(), memory=memory)
    qwen_host = LLMEngine(qwen2_dir, config(), memory=MemoryManager(Arena(ARENA_BYTES))).evict()
    assert qwen_host is not None
    wrong = dataclasses.replace(host, layout=qwen_host.layout)  # qwen's biases: another layout
    with pytest.raises(HostCopyMismatchError):
        LLMEngine(wrong, config(), memory=memory, model_name="x")
    # An arena too small for the model: out of memory, nothing reserved, the copy still usable.
    small = MemoryManager(Arena(host.nbytes))
    with pytest.raises(OutOfMemoryError):
        LLMEngine(host, config(), memory=small)
    assert small.usage() == {} and small.free_bytes == host.nbytes
    assert "x" not in memory
    memory.check()
    assert generate(LLMEngine(host, config(), memory=MemoryManager(Arena(ARENA_BYTES))), PROMPTS)


def test_only_an_engine_in_an_arena_can_be_evicted(llama_gqa_dir: Path) -> None:
    with pytest.raises(ValueError, match="arena"):
        LLMEngine(llama_gqa_dir, config()).evict()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_model_is_copied_to_pinned_memory_and_back(llama_gqa_dir: Path) -> None:
    memory = MemoryManager(Arena(ARENA_BYTES, device="cuda"))
    cfg = config(device="cuda")
    engine = LLMEngine(llama_gqa_dir, cfg, memory=memory, model_name="gqa")
    before = generate(engine, PROMPTS)
    at_eviction = slot_bytes(memory, "gqa", memory.partition("gqa").weights.nbytes)
    host = engine.evict()
    assert host is not None and host.pinned and host.weights.device.type == "cpu"
    assert torch.equal(host.weights, at_eviction[: host.nbytes].cpu())
    reloaded = LLMEngine(host, cfg, memory=memory)
    assert generate(reloaded, PROMPTS) == before
