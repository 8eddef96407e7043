"""The embedding engine built in a partition of the arena (weights slot, no KV pool): the same vectors as
an encoder built alone, evicted to a host copy and rebuilt from it without the checkpoint, jobs already
submitted finished before the bytes go, and side by side with a decoder in one arena."""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from services.worker.engine.embedding import EmbeddingEngine
from services.worker.engine.errors import EngineDeadError, InvalidRequestError
from services.worker.engine.llm_engine import LLMEngine
from services.worker.memory.arena import Arena
from services.worker.memory.errors import ModelAlreadyResidentError, ModelEvictedError
from services.worker.memory.host_copy import HostCopy
from services.worker.memory.manager import MemoryManager
from tests.worker.engine.reference import mixed_prompts
from tests.worker.memory.test_engine_in_arena import assert_inside, config, generate

# MiniLM's float32 weights take 86 MiB; the rest leaves room for a tiny decoder and its KV pool.
ARENA_BYTES = 96 * 1024**2
TEXTS = [
    "A man is eating food.",
    "Paged attention keeps the KV cache in fixed-size blocks so that memory is not fragmented. " * 4,
    "héllo wörld 日本語 🙂",
    "Embeddings",
]


@pytest.fixture(scope="module")
def expected(minilm_dir: Path) -> np.ndarray:
    """TEXTS encoded by a MiniLM built on its own, outside any arena."""
    engine = EmbeddingEngine(minilm_dir)
    try:
        return engine.encode(TEXTS)
    finally:
        engine.close()


@pytest.fixture
def memory() -> MemoryManager:
    return MemoryManager(Arena(ARENA_BYTES))


@pytest.fixture
def encoder(minilm_dir: Path, memory: MemoryManager) -> Iterator[EmbeddingEngine]:
    engine = EmbeddingEngine(minilm_dir, memory=memory, model_name="minilm")
    yield engine
    engine.close()


def test_same_vectors_as_an_encoder_built_alone(
    encoder: EmbeddingEngine, memory: MemoryManager, expected: np.ndarray
) -> None:
    part = memory.partition("minilm")
    assert encoder.partition == part and part.kv is None and part.kv_bytes == 0
    model = encoder.model
    tensors = dict(itertools.chain(model.named_parameters(), model.named_buffers()))
    for tensor in tensors.values():
        assert_inside(tensor, memory.arena, part.weights)
    distinct = sum(t.numel() * t.element_size() for t in tensors.values())
    assert encoder.weight_bytes == part.weight_bytes == memory.usage()["minilm"].weight_bytes
    assert distinct <= encoder.weight_bytes < distinct + 256 * (len(tensors) + 1)
    np.testing.assert_array_equal(encoder.encode(TEXTS), expected)
    memory.check()


def test_weight_bytes_outside_an_arena(minilm_dir: Path) -> None:
    engine = EmbeddingEngine(minilm_dir)
    try:
        assert engine.partition is None
        params = engine.model.parameters()
        assert engine.weight_bytes == sum(t.numel() * t.element_size() for t in params)
        with pytest.raises(ValueError, match="arena"):
            engine.evict()
    finally:
        engine.close()


def test_reload_from_host_gives_the_same_vectors_without_the_checkpoint(
    minilm_dir: Path, tmp_path: Path, memory: MemoryManager, expected: np.ndarray
) -> None:
    # A private copy of the checkpoint, deleted before the reload: nothing may be read from disk.
    model_dir = tmp_path / "minilm"
    shutil.copytree(minilm_dir, model_dir)
    engine = EmbeddingEngine(model_dir, memory=memory)
    assert engine.model_name == "minilm"
    usage = memory.usage()["minilm"]
    host = engine.evict()
    assert isinstance(host, HostCopy) and host.model == "minilm" and not host.pinned
    assert host.nbytes == usage.weight_bytes and host.tokenizer is not None
    assert engine.partition is None and engine.weight_bytes == 0
    assert memory.usage() == {} and memory.free_bytes == ARENA_BYTES
    memory.check()
    shutil.rmtree(model_dir)

    reloaded = EmbeddingEngine(host, memory=memory)
    try:
        assert reloaded.model_name == "minilm" and memory.usage() == {"minilm": usage}
        memory.check()
        np.testing.assert_array_equal(reloaded.encode(TEXTS), expected)
    finally:
        reloaded.close()


async def test_submit_after_evict_raises(encoder: EmbeddingEngine, memory: MemoryManager) -> None:
    assert encoder.evict(keep_host_copy=False) is None
    assert memory.free_bytes == ARENA_BYTES
    memory.check()
    with pytest.raises(ModelEvictedError, match="minilm"):
        encoder.submit(TEXTS)
    with pytest.raises(ModelEvictedError):
        encoder.encode(TEXTS)
    with pytest.raises(ModelEvictedError):
        await encoder.encode_with_usage(TEXTS)
    with pytest.raises(ModelEvictedError):
        encoder.evict()
    encoder.close()  # a no-op by now


def test_jobs_submitted_before_evict_finish_before_the_bytes_go(
    encoder: EmbeddingEngine, memory: MemoryManager, expected: np.ndarray
) -> None:
    # Hold the batching thread inside its first forward, so the later jobs are still queued when
    # evict() starts; every forward must see the partition still held.
    release = threading.Event()
    resident_during_forward: list[bool] = []
    embed = encoder._embed

    def held_embed(rows: list[list[int]]) -> np.ndarray:
        release.wait(timeout=30)
        resident_during_forward.append("minilm" in memory)
        return embed(rows)

    encoder._embed = held_embed  # type: ignore[method-assign]
    futures = [encoder.submit([text]) for text in TEXTS]
    hosts: list[HostCopy | None] = []
    evicting = threading.Thread(target=lambda: hosts.append(encoder.evict()))
    evicting.start()
    evicting.join(timeout=0.2)
    assert evicting.is_alive() and "minilm" in memory  # waiting for the submitted jobs
    with pytest.raises(ModelEvictedError):
        encoder.submit(TEXTS)  # no new work once evict() has begun
    release.set()
    evicting.join(timeout=30)
    assert not evicting.is_alive() and hosts and hosts[0] is not None
    assert all(resident_during_forward)
    for future, row in zip(futures, expected, strict=True):
        # Batched apart from the others here, so padded to another width: equal up to rounding.
        np.testing.assert_allclose(future.result(timeout=0)[0], row, atol=1e-6)
    assert "minilm" not in memory


def test_close_then_evict(encoder: EmbeddingEngine, memory: MemoryManager) -> None:
    encoder.close()
    with pytest.raises(EngineDeadError):
        encoder.submit(TEXTS)
    assert "minilm" in memory  # closing stops the thread; the bytes stay until evict()
    assert encoder.evict() is not None
    assert memory.free_bytes == ARENA_BYTES


def test_an_encoder_and_a_decoder_share_one_arena(
    minilm_dir: Path, llama_gqa_dir: Path, memory: MemoryManager, expected: np.ndarray
) -> None:
    prompts = mixed_prompts(4, vocab=512, seed=11)
    expected_tokens = generate(LLMEngine(llama_gqa_dir, config()), prompts)
    decoder = LLMEngine(llama_gqa_dir, config(), memory=memory, model_name="gqa")
    encoder = EmbeddingEngine(minilm_dir, memory=memory, model_name="minilm")
    try:
        a, b = memory.partition("gqa"), memory.partition("minilm")
        assert not any(x.overlaps(y) for x in a.ranges() for y in b.ranges())
        memory.check()
        pending = encoder.submit(TEXTS)  # encodes on its thread while the decoder steps here
        assert generate(decoder, prompts) == expected_tokens
        np.testing.assert_array_equal(pending.result(timeout=60), expected)
        # Evicting the encoder leaves the decoder's bytes alone; it reloads beside it.
        host = encoder.evict()
        assert host is not None and memory.partition("gqa") == a
        memory.check()
        encoder = EmbeddingEngine(host, memory=memory)
        np.testing.assert_array_equal(encoder.encode(TEXTS), expected)
        assert generate(decoder, prompts) == expected_tokens
    finally:
        encoder.close()


def test_bad_loads_reserve_nothing(minilm_dir: Path, llama_gqa_dir: Path, memory: MemoryManager) -> None:
    with pytest.raises(InvalidRequestError, match="decoder"):
        EmbeddingEngine(llama_gqa_dir, memory=memory, model_name="gqa")
    assert memory.usage() == {}
    decoder_host = LLMEngine(llama_gqa_dir, config(), memory=memory, model_name="gqa").evict()
    assert decoder_host is not None
    with pytest.raises(InvalidRequestError, match="decoder"):
        EmbeddingEngine(decoder_host, memory=memory)
    assert memory.usage() == {}

    encoder = EmbeddingEngine(minilm_dir, memory=memory, model_name="minilm")
    with pytest.raises(ModelAlreadyResidentError):
        EmbeddingEngine(minilm_dir, memory=memory, model_name="minilm")
    host = encoder.evict()
    assert host is not None
    with pytest.raises(ValueError, match="arena"):
        EmbeddingEngine(host)
    with pytest.raises(ValueError, match="bfloat16"):
        EmbeddingEngine(host, dtype="bfloat16", memory=memory)
    with pytest.raises(ValueError, match="arena"):
        EmbeddingEngine(minilm_dir, memory=MemoryManager(Arena(1024, device="meta")))
    assert memory.usage() == {} and memory.free_bytes == ARENA_BYTES
    memory.check()
    # The host copy is still good after the refusals.
    wrong_name = dataclasses.replace(host, model="elsewhere")
    reloaded = EmbeddingEngine(wrong_name, memory=memory)
    try:
        assert reloaded.model_name == "elsewhere" and "elsewhere" in memory
    finally:
        reloaded.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_encoder_is_copied_to_pinned_memory_and_back(minilm_dir: Path, expected: np.ndarray) -> None:
    memory = MemoryManager(Arena(ARENA_BYTES, device="cuda"))
    engine = EmbeddingEngine(minilm_dir, device="cuda", memory=memory, model_name="minilm")
    before = engine.encode(TEXTS)
    np.testing.assert_allclose(before, expected, atol=2e-4)
    host = engine.evict()
    assert host is not None and host.pinned and host.weights.device.type == "cpu"
    reloaded = EmbeddingEngine(host, device="cuda", memory=memory)
    try:
        np.testing.assert_array_equal(reloaded.encode(TEXTS), before)
    finally:
        reloaded.close()
