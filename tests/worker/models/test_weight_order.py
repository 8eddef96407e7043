"""The LM head on CPU: stored column-major when untied (every way a model gets storage applies the order
before weights are copied in, and the logits are those of the row-major weight), and computed in
vocabulary slices between preemption points with the same logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.worker.memory.arena import Arena
from services.worker.memory.manager import MemoryManager
from services.worker.memory.placement import evict_to_host, load_from_host_copy, load_into_partition
from services.worker.models import llama
from services.worker.models.checkpoint import iter_safetensors
from services.worker.models.loader import load_model
from services.worker.models.preemption import PreemptionPoints


def _checkpoint_head(model_dir: Path) -> torch.Tensor:
    return next(t for _, name, t in iter_safetensors(model_dir) if name == "lm_head.weight")


def _assert_column_major_head(model: torch.nn.Module, model_dir: Path) -> None:
    head = model.lm_head.weight
    vocab, hidden = head.shape
    assert head.stride() == (1, vocab)  # the bytes hold the transpose [hidden, vocab]
    expected = _checkpoint_head(model_dir)
    assert torch.equal(head, expected)
    hidden_states = torch.randn(3, hidden)
    torch.testing.assert_close(model.compute_logits(hidden_states), hidden_states @ expected.t())


def test_loaded_on_cpu_the_untied_head_is_column_major_with_its_values(llama_gqa_dir: Path) -> None:
    _assert_column_major_head(load_model(llama_gqa_dir).model, llama_gqa_dir)


def test_a_tied_head_stays_the_row_major_embedding_table(llama_tied_dir: Path) -> None:
    model = load_model(llama_tied_dir).model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.is_contiguous()


def test_arena_load_and_host_copy_reload_keep_the_order(llama_gqa_dir: Path) -> None:
    memory = MemoryManager(Arena(8 * 1024**2))
    placed = load_into_partition(memory, "m", llama_gqa_dir, "float32", kv_bytes=0)
    _assert_column_major_head(placed.loaded.model, llama_gqa_dir)
    host = evict_to_host(memory, placed)
    assert host is not None
    reloaded = load_from_host_copy(memory, "m", host, kv_bytes=0)
    _assert_column_major_head(reloaded.loaded.model, llama_gqa_dir)


def test_the_head_in_vocabulary_slices_gives_the_same_logits(
    llama_gqa_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_model(llama_gqa_dir).model
    monkeypatch.setattr(llama, "VOCAB_PER_SLICE", 100)  # the test model's vocabulary is 512
    hidden = torch.randn(5, model.config.hidden_size)
    points: list[int] = []
    sliced = model.compute_logits(hidden, PreemptionPoints(lambda: points.append(1)))
    assert torch.equal(sliced, model.compute_logits(hidden))
    assert len(points) == 5  # between the six slices of 512 entries
