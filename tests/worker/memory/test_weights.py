"""Sizing a weights slot from safetensors headers, and laying tensors out in it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena
from services.worker.memory.manager import MemoryManager
from services.worker.memory.weights import (
    TensorSpec,
    checkpoint_tensor_specs,
    layout_tensors,
    weight_bytes_of,
)
from services.worker.models.checkpoint import safetensors_files
from services.worker.models.errors import CheckpointError
from services.worker.models.synthetic import make_decoder_checkpoint


def _loaded(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in safetensors_files(model_dir):
        tensors.update(load_file(file))
    return tensors


def test_weight_bytes_equal_the_loaded_tensor_sizes(llama_gqa_dir: Path) -> None:
    tensors = _loaded(llama_gqa_dir)
    expected = sum(t.numel() * t.element_size() for t in tensors.values())
    assert weight_bytes_of(llama_gqa_dir) == expected
    # Cast to a 2-byte dtype on load: floating float32 tensors take half.
    assert weight_bytes_of(llama_gqa_dir, dtype="bfloat16") == expected // 2
    assert weight_bytes_of(llama_gqa_dir, dtype=torch.float32) == expected


def test_sharded_checkpoint_sizes_like_a_single_file(llama_gqa_dir: Path, tmp_path: Path) -> None:
    sharded = make_decoder_checkpoint(
        tmp_path / "sharded", num_heads=4, num_kv_heads=2, max_shard_size="100KB"
    )
    assert len(safetensors_files(sharded)) > 1
    assert weight_bytes_of(sharded) == weight_bytes_of(llama_gqa_dir)


def test_specs_match_the_tensors(llama_gqa_dir: Path) -> None:
    tensors = _loaded(llama_gqa_dir)
    specs = {s.name: s for s in checkpoint_tensor_specs(llama_gqa_dir)}
    assert set(specs) == set(tensors)
    for name, tensor in tensors.items():
        assert (specs[name].dtype, specs[name].shape) == (tensor.dtype, tuple(tensor.shape))


def test_recomputed_buffers_are_not_counted(tmp_path: Path) -> None:
    save_file(
        {"w": torch.zeros(4, 4), "model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)},
        tmp_path / "model.safetensors",
    )
    assert weight_bytes_of(tmp_path) == 64


def test_integer_tensors_keep_their_dtype_when_cast(tmp_path: Path) -> None:
    save_file(
        {"w": torch.zeros(4, dtype=torch.float32), "ids": torch.zeros(4, dtype=torch.int64)},
        tmp_path / "a.safetensors",
    )
    assert weight_bytes_of(tmp_path, dtype="float16") == 4 * 2 + 4 * 8


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "no \\*.safetensors file"),
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json"),
            "unreadable",
        ),
        (
            lambda d: (d / "model.safetensors.index.json").write_text(
                '{"weight_map": {"x": "gone.safetensors"}}'
            ),
            "missing",
        ),
    ],
)
def test_bad_checkpoints_raise_checkpoint_error(tmp_path: Path, make: object, message: str) -> None:
    make(tmp_path)  # type: ignore[operator]
    with pytest.raises(CheckpointError, match=message):
        weight_bytes_of(tmp_path)


def test_missing_directory_raises_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        weight_bytes_of(tmp_path / "nope")


@pytest.mark.parametrize(
    ("alignment", "expected"),
    [
        # u8[3] then f32[2] then bf16[1]: each tensor starts on max(alignment, its itemsize).
        (1, {"a": ByteRange(0, 3), "b": ByteRange(4, 8), "c": ByteRange(12, 2)}),
        (16, {"a": ByteRange(0, 3), "b": ByteRange(16, 8), "c": ByteRange(32, 2)}),
        (256, {"a": ByteRange(0, 3), "b": ByteRange(256, 8), "c": ByteRange(512, 2)}),
    ],
)
def test_layout_aligns_each_tensor(alignment: int, expected: dict[str, ByteRange]) -> None:
    specs = [
        TensorSpec("a", torch.uint8, (3,)),
        TensorSpec("b", torch.float32, (2,)),
        TensorSpec("c", torch.bfloat16, (1,)),
    ]
    layout = layout_tensors(specs, alignment)
    assert layout.ranges == expected
    assert layout.total_bytes == expected["c"].end


@pytest.mark.parametrize(
    ("specs", "alignment"),
    [([TensorSpec("a", torch.uint8, (1,))], 3), ([TensorSpec("a", torch.uint8, (1,))] * 2, 1)],
)
def test_layout_rejects_bad_input(specs: list[TensorSpec], alignment: int) -> None:
    with pytest.raises(ValueError):
        layout_tensors(specs, alignment)


def test_checkpoint_loads_into_arena_views(llama_gqa_dir: Path) -> None:
    """The next step's path in miniature: size a slot, reserve it, copy each tensor into its view."""
    layout = layout_tensors(checkpoint_tensor_specs(llama_gqa_dir), alignment=256)
    assert layout.total_bytes == weight_bytes_of(llama_gqa_dir, tensor_alignment=256)
    arena = Arena(layout.total_bytes + 4096)
    manager = MemoryManager(arena)
    part = manager.reserve("llama", layout.total_bytes, 1024)
    tensors = _loaded(llama_gqa_dir)
    views = {}
    for name, tensor in tensors.items():
        spec = layout.specs[name]
        views[name] = arena.view(layout.place(part.weights, name), spec.dtype, spec.shape)
        views[name].copy_(tensor)
    for name, tensor in tensors.items():
        assert torch.equal(views[name], tensor)
        assert views[name].untyped_storage().data_ptr() == arena.data_ptr
    with pytest.raises(ValueError, match="smaller"):
        layout.place(ByteRange(0, 256), next(iter(tensors)))
