"""The GGUF header reader and the DecoderConfig derived from it: the real SmolLM2 file's fields, every
metadata value type read as gguf.GGUFReader reads it, and each config option derived from its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from services.worker.models.catalog import resolve_model_source
from services.worker.models.config import load_model_config
from services.worker.models.config_types import DecoderConfig
from services.worker.models.gguf_config import gguf_decoder_config
from services.worker.models.gguf_file import is_gguf_path, read_gguf
from tests.worker.models.gguf_builders import TINY_VOCAB, tiny_model_gguf

GGUF = resolve_model_source("smollm2")
SMOLLM2_FIELDS: dict[str, Any] = {
    "architecture": "LlamaForCausalLM",
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,  # stored as float32; read back as the value meant, not 9.99999974e-06
    "rope_theta": 100000.0,
    "rope_scaling": None,
    "max_position_embeddings": 8192,
    "max_model_len": 8192,
    "tie_word_embeddings": True,  # no output.weight
    "attention_bias": False,
    "o_proj_bias": False,
    "mlp_bias": False,
    "sliding_window": None,
    "torch_dtype": None,
    "eos_token_ids": frozenset({2}),
    "bos_token_id": 1,
}


@pytest.fixture(scope="module")
def smollm2() -> DecoderConfig:
    config = load_model_config(GGUF)
    assert isinstance(config, DecoderConfig)
    return config


@pytest.mark.parametrize("field", SMOLLM2_FIELDS)
def test_smollm2_config_field(field: str, smollm2: DecoderConfig) -> None:
    assert getattr(smollm2, field) == SMOLLM2_FIELDS[field]


def test_smollm2_tensor_table() -> None:
    header = read_gguf(GGUF)
    assert len(header.tensors) == 272  # 30 blocks x 9 + embedding + final norm
    expected = {
        "token_embd.weight": ("Q8_0", (49152, 576)),
        "blk.0.attn_norm.weight": ("F32", (576,)),
        "blk.0.attn_q.weight": ("Q4_1", (576, 576)),
        "blk.29.attn_k.weight": ("Q4_1", (192, 576)),
        "blk.7.ffn_down.weight": ("Q4_1", (576, 1536)),
        "output_norm.weight": ("F32", (576,)),
    }
    for name, (kind, shape) in expected.items():
        tensor = header.tensors[name]
        assert (tensor.ggml_type.name, tensor.shape) == (kind, shape), name
    assert "output.weight" not in header.tensors
    assert header.metadata["tokenizer.ggml.pre"] == "smollm"
    assert len(header.metadata["tokenizer.ggml.tokens"]) == 49152


def test_every_value_type_reads_as_gguf_reader_reads_it(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "types.gguf", "llama")
    values: dict[str, Any] = {
        "t.u8": (writer.add_uint8, 200),
        "t.i8": (writer.add_int8, -100),
        "t.u16": (writer.add_uint16, 60000),
        "t.i16": (writer.add_int16, -30000),
        "t.u32": (writer.add_uint32, 4_000_000_000),
        "t.i32": (writer.add_int32, -2_000_000_000),
        "t.u64": (writer.add_uint64, 2**60),
        "t.i64": (writer.add_int64, -(2**60)),
        "t.f32": (writer.add_float32, 0.25),
        "t.f64": (writer.add_float64, 1 / 3),
        "t.bool": (writer.add_bool, True),
        "t.str": (writer.add_string, "héllo ✓"),
        "t.ints": (writer.add_array, [1, 2, 3]),
        "t.strs": (writer.add_array, ["a", "", "Ġb c"]),
        "t.floats": (writer.add_array, [0.5, -1.5]),
    }
    for key, (add, value) in values.items():
        add(key, value)
    writer.add_tensor("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = read_gguf(tmp_path / "types.gguf")
    reference = gguf.GGUFReader(tmp_path / "types.gguf")
    for key in values:
        assert ours.metadata[key] == reference.fields[key].contents(), key
    [tensor] = reference.tensors
    assert ours.tensors["w"].shape == (2, 3) and ours.tensors["w"].offset == tensor.data_offset
    assert ours.tensors["w"].nbytes == tensor.n_bytes == 24


DERIVED_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    # name: (metadata overrides, tensors to add, expected config fields)
    "defaults": (
        {},
        {},
        {"head_dim": 16, "rope_theta": 10000.0, "vocab_size": TINY_VOCAB, "bos_token_id": None},
    ),
    "explicit_key_length": (
        {"llama.attention.key_length": 16, "llama.attention.value_length": 16},
        {},
        {"head_dim": 16},
    ),
    "vocab_size_key_wins": ({"llama.vocab_size": TINY_VOCAB}, {}, {"vocab_size": TINY_VOCAB}),
    "no_kv_count_means_mha": ({"llama.attention.head_count_kv": None}, {}, {"num_key_value_heads": 4}),
    "eot_and_eom_stop_too": (
        {
            "tokenizer.ggml.eot_token_id": 7,
            "tokenizer.ggml.eom_token_id": 8,
            "tokenizer.ggml.bos_token_id": 1,
        },
        {},
        {"eos_token_ids": frozenset({2, 7, 8}), "bos_token_id": 1},
    ),
    "untied_with_output": ({}, {"output.weight": (TINY_VOCAB, 64)}, {"tie_word_embeddings": False}),
    "llama_with_qkvo_bias": (
        {},
        {"blk.0.attn_q.bias": (64,), "blk.0.attn_output.bias": (64,)},
        {"attention_bias": True, "o_proj_bias": True},
    ),
    "rope_scaling_none": ({"llama.rope.scaling.type": "none"}, {}, {"rope_scaling": None}),
    "rope_theta": ({"llama.rope.freq_base": 500000.0}, {}, {"rope_theta": 500000.0}),
}


@pytest.mark.parametrize("case", DERIVED_CASES)
def test_config_option_derived_from_metadata(case: str, tmp_path: Path) -> None:
    metadata, tensors, expected = DERIVED_CASES[case]
    extra = {name: np.zeros(shape, dtype=np.float32) for name, shape in tensors.items()}
    config = gguf_decoder_config(
        read_gguf(tiny_model_gguf(tmp_path / "m.gguf", metadata=metadata, extra=extra))
    )
    assert {field: getattr(config, field) for field in expected} == expected


def test_qwen2_has_qkv_bias_and_no_o_bias(tmp_path: Path) -> None:
    config = gguf_decoder_config(read_gguf(tiny_model_gguf(tmp_path / "q.gguf", arch="qwen2")))
    assert (config.architecture, config.attention_bias, config.o_proj_bias) == (
        "Qwen2ForCausalLM",
        True,
        False,
    )


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("model.gguf", None, True),  # by suffix, even before it exists
        ("MODEL.GGUF", b"x", True),
        ("model.bin", b"GGUF\x03\x00\x00\x00", True),  # by magic
        ("model.bin", b"PK\x03\x04", False),
        ("config.json", b"{}", False),
    ],
)
def test_is_gguf_path(name: str, content: bytes | None, expected: bool, tmp_path: Path) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert is_gguf_path(path) is expected
    assert is_gguf_path(tmp_path) is False  # a directory never is
