"""A GGUF we cannot serve fails at load with CheckpointError naming the file and the problem, before
any memory is reserved for it: truncated, not GGUF at all, or a model, tensor type, tokenizer or
option we do not implement."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from services.worker.engine.config import EngineConfig
from services.worker.engine.llm_engine import LLMEngine
from services.worker.memory.arena import Arena
from services.worker.memory.manager import MemoryManager
from services.worker.models.catalog import resolve_model_source
from services.worker.models.config import load_model_config
from services.worker.models.errors import CheckpointError
from services.worker.models.loader import load_model
from tests.worker.models.gguf_builders import tiny_model_gguf

REAL = resolve_model_source("smollm2")


def _bytes(data: bytes) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        path.write_bytes(data)
        return path

    return build


def _truncated(source: Callable[[Path], Path], keep: int | float) -> Callable[[Path], Path]:
    """source's file cut to keep bytes (an int) or that fraction of its size (a float)."""

    def build(path: Path) -> Path:
        data = source(path.with_name("whole.gguf")).read_bytes()
        path.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
        return path

    return build


def _real_prefix(nbytes: int) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        with REAL.open("rb") as f:
            path.write_bytes(f.read(nbytes))
        return path

    return build


def _tiny(**kwargs: object) -> Callable[[Path], Path]:
    return lambda path: tiny_model_gguf(path, **kwargs)  # type: ignore[arg-type]


_INT32_WEIGHT = np.zeros((64, 64), dtype=np.int32)
_SPM_TOKENIZER = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>"]}
BAD_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    # name: (writes the file at the given path, words the problem must contain)
    "empty": (_bytes(b""), "not a GGUF file"),
    "text_with_gguf_suffix": (_bytes(b"hello, I am not a model\n" * 10), "not a GGUF file"),
    "safetensors_with_gguf_suffix": (_bytes(struct.pack("<Q", 2) + b"{}"), "not a GGUF file"),
    "gguf_version_1": (_bytes(b"GGUF" + struct.pack("<IIIQ", 1, 0, 0, 0)), "unsupported GGUF version 1"),
    "cut_in_the_counts": (_truncated(_tiny(), 10), "truncated"),
    "cut_in_the_metadata": (_truncated(_tiny(), 200), "truncated"),
    "cut_in_the_tensor_data": (_truncated(_tiny(), 0.9), "truncated: tensor"),
    "real_file_cut_in_the_vocabulary": (_real_prefix(1_000_000), "truncated"),
    "real_file_cut_in_the_weights": (_real_prefix(40_000_000), "truncated: tensor"),
    "unsupported_architecture": (_tiny(arch="gemma2"), "unsupported GGUF architecture 'gemma2'"),
    "unsupported_quant_type": (
        _tiny(extra={"blk.0.attn_q.weight": _INT32_WEIGHT}),
        "'blk.0.attn_q.weight' has type I32, which we cannot dequantize",
    ),
    "unknown_tensor": (
        _tiny(extra={"blk.0.attn_q_norm.weight": np.ones(16, dtype=np.float32)}),
        "unexpected tensor 'blk.0.attn_q_norm.weight'",
    ),
    "missing_tensor": (
        _tiny(drop=("blk.0.ffn_down.weight",)),
        "missing tensor 'model.layers.0.mlp.down_proj.weight' (not in the GGUF file)",
    ),
    "wrong_tensor_shape": (
        _tiny(extra={"blk.0.attn_v.weight": np.zeros((64, 64), dtype=np.float32)}),
        "'model.layers.0.self_attn.v_proj.weight' has shape [64, 64], expected [32, 64]",
    ),
    "missing_key": (_tiny(metadata={"llama.block_count": None}), "missing metadata 'llama.block_count'"),
    "sentencepiece_tokenizer": (
        _tiny(metadata=_SPM_TOKENIZER),
        "tokenizer.ggml.model 'llama' is not supported",
    ),
    "rope_scaling_linear": (
        _tiny(metadata={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}),
        "unsupported RoPE scaling llama.rope.scaling.type 'linear'",
    ),
    "llama31_rope_factors": (
        _tiny(extra={"rope_freqs.weight": np.ones(8, dtype=np.float32)}),
        "per-frequency RoPE factors",
    ),
    "mixture_of_experts": (_tiny(metadata={"llama.expert_count": 8}), "mixture-of-experts is not supported"),
    "partial_rope": (_tiny(metadata={"llama.rope.dimension_count": 8}), "partial RoPE is not supported"),
    "heads_not_dividing": (
        _tiny(metadata={"llama.attention.head_count_kv": 3}),
        "head_count 4 is not a multiple of head_count_kv 3",
    ),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_gguf_fails_naming_the_file(case: str, tmp_path: Path) -> None:
    build, words = BAD_FILES[case]
    path = build(tmp_path / "model.gguf")
    with pytest.raises(CheckpointError) as raised:
        load_model(path)
    assert raised.value.path == path
    assert words in raised.value.problem
    assert str(raised.value).startswith(str(path))


@pytest.mark.parametrize("case", ["text_with_gguf_suffix", "unsupported_architecture", "missing_key"])
def test_config_alone_fails_the_same_way(case: str, tmp_path: Path) -> None:
    build, words = BAD_FILES[case]
    path = build(tmp_path / "model.gguf")
    with pytest.raises(CheckpointError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_model_config(path)


@pytest.mark.parametrize("case", ["unsupported_quant_type", "unknown_tensor", "cut_in_the_tensor_data"])
def test_bad_file_in_the_arena_leaves_it_empty(case: str, tmp_path: Path) -> None:
    path = BAD_FILES[case][0](tmp_path / "model.gguf")
    memory = MemoryManager(Arena(8 * 1024**2))
    with pytest.raises(CheckpointError):
        LLMEngine(path, EngineConfig(kv_cache_bytes=64 * 8192), memory=memory)
    assert "model" not in memory
    assert memory.free_bytes == memory.arena.total_bytes


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="file not found"):
        load_model(tmp_path / "absent.gguf")
