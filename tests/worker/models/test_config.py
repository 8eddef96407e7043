"""config.json parsing: one table of checkpoints that parse, one of checkpoints that must be refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.worker.models.config import load_model_config
from services.worker.models.config_types import DecoderConfig, EncoderConfig
from services.worker.models.errors import CheckpointError

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
QWEN2 = {
    **LLAMA,
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "sliding_window": 4096,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
}
MISTRAL = {**LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 256}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}
BERT = {
    "architectures": ["BertForMaskedLM"],
    "vocab_size": 100,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
}


def write(model_dir: Path, config: dict[str, Any] | str, **files: Any) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config)
    (model_dir / "config.json").write_text(text)
    for name, content in files.items():
        path = model_dir / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return model_dir


def without(config: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != key}


PARSES = [
    # (case id, config.json, extra files, expected fields)
    (
        "llama",
        LLAMA,
        {},
        {
            "architecture": "LlamaForCausalLM",
            "head_dim": 16,
            "num_key_value_heads": 2,
            "rope_theta": 500000.0,
            "rope_scaling": None,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "eos_token_ids": frozenset({2}),
            "bos_token_id": 1,
            "torch_dtype": "bfloat16",
            "max_model_len": 1024,
        },
    ),
    ("kv heads default to heads", without(LLAMA, "num_key_value_heads"), {}, {"num_key_value_heads": 4}),
    ("explicit head_dim", {**LLAMA, "head_dim": 32}, {}, {"head_dim": 32}),
    ("rope_theta default", without(LLAMA, "rope_theta"), {}, {"rope_theta": 10000.0}),
    (
        "llama attention_bias",
        {**LLAMA, "attention_bias": True},
        {},
        {"attention_bias": True, "o_proj_bias": True},
    ),
    (
        "qwen2 bias, tied, window unused",
        QWEN2,
        {},
        {
            "attention_bias": True,
            "o_proj_bias": False,
            "tie_word_embeddings": True,
            "sliding_window": None,
            "max_model_len": 1024,
        },
    ),
    (
        "qwen2 window in use",
        {**QWEN2, "use_sliding_window": True, "sliding_window": 512},
        {},
        {"sliding_window": 512, "max_model_len": 512},
    ),
    ("mistral window caps length", MISTRAL, {}, {"sliding_window": 256, "max_model_len": 256}),
    (
        "mistral no window",
        {**MISTRAL, "sliding_window": None},
        {},
        {"sliding_window": None, "max_model_len": 1024},
    ),
    ("llama3 rope_scaling", {**LLAMA, "rope_scaling": LLAMA3}, {}, {"rope_scaling": LLAMA3}),
    (
        "llama3 old 'type' key",
        {**LLAMA, "rope_scaling": {**without(LLAMA3, "rope_type"), "type": "llama3"}},
        {},
        {"rope_scaling": LLAMA3},
    ),
    (
        "rope_parameters (transformers 5)",
        {**without(LLAMA, "rope_theta"), "rope_parameters": {**LLAMA3, "rope_theta": 123.0}},
        {},
        {"rope_theta": 123.0, "rope_scaling": LLAMA3},
    ),
    (
        "rope_parameters default",
        {**without(LLAMA, "rope_theta"), "rope_parameters": {"rope_type": "default", "rope_theta": 7.0}},
        {},
        {"rope_theta": 7.0, "rope_scaling": None},
    ),
    (
        "eos list from generation_config",
        LLAMA,
        {"generation_config.json": {"eos_token_id": [2, 7, 9]}},
        {"eos_token_ids": frozenset({2, 7, 9})},
    ),
    (
        "eos int from generation_config",
        LLAMA,
        {"generation_config.json": {"eos_token_id": 5}},
        {"eos_token_ids": frozenset({5})},
    ),
    ("eos list in config.json", {**LLAMA, "eos_token_id": [2, 3]}, {}, {"eos_token_ids": frozenset({2, 3})}),
    ("no eos at all", without(LLAMA, "eos_token_id"), {}, {"eos_token_ids": frozenset()}),
    (
        "dtype key (transformers 5)",
        {**without(LLAMA, "torch_dtype"), "dtype": "float16"},
        {},
        {"torch_dtype": "float16"},
    ),
    (
        "bert defaults",
        BERT,
        {},
        {
            "architecture": "BertForMaskedLM",
            "pooling": "mean",
            "normalize": True,
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-12,
            "max_seq_length": 128,
        },
    ),
    (
        "bert sentence-transformers cls, no normalize",
        BERT,
        {
            "modules.json": [
                {"type": "sentence_transformers.models.Transformer", "path": ""},
                {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
            ],
            "1_Pooling__config.json": {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
            "sentence_bert_config.json": {"max_seq_length": 64},
        },
        {"pooling": "cls", "normalize": False, "max_seq_length": 64},
    ),
]


@pytest.mark.parametrize(("config", "files", "expected"), [c[1:] for c in PARSES], ids=[c[0] for c in PARSES])
def test_parses(
    tmp_path: Path, config: dict[str, Any], files: dict[str, Any], expected: dict[str, Any]
) -> None:
    parsed = load_model_config(write(tmp_path / "m", config, **files))
    assert isinstance(parsed, EncoderConfig if "Bert" in config["architectures"][0] else DecoderConfig)
    assert {k: getattr(parsed, k) for k in expected} == expected


def test_minilm(minilm_dir: Path) -> None:
    parsed = load_model_config(minilm_dir)
    assert isinstance(parsed, EncoderConfig)
    got = (parsed.hidden_size, parsed.pooling, parsed.normalize, parsed.max_seq_length)
    assert got == (384, "mean", True, 256)


REFUSED = [
    # (case id, config.json (dict or raw text), extra files, file named in the error, words in the error)
    (
        "unknown architecture",
        {**LLAMA, "architectures": ["GPT2LMHeadModel"]},
        {},
        "config.json",
        ["GPT2LMHeadModel", "supported", "LlamaForCausalLM"],
    ),
    (
        "no architectures",
        without(without(LLAMA, "architectures"), "model_type"),
        {},
        "config.json",
        ["architectures"],
    ),
    ("missing hidden_size", without(LLAMA, "hidden_size"), {}, "config.json", ["missing", "'hidden_size'"]),
    ("negative layers", {**LLAMA, "num_hidden_layers": -1}, {}, "config.json", ["num_hidden_layers"]),
    ("bad JSON", "{not json", {}, "config.json", ["not valid JSON"]),
    ("JSON list", "[1, 2]", {}, "config.json", ["JSON object"]),
    (
        "unsupported rope type",
        {**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
        {},
        "config.json",
        ["'yarn'", "llama3"],
    ),
    (
        "llama3 missing key",
        {**LLAMA, "rope_scaling": without(LLAMA3, "low_freq_factor")},
        {},
        "config.json",
        ["low_freq_factor"],
    ),
    (
        "heads not multiple of kv",
        {**LLAMA, "num_key_value_heads": 3},
        {},
        "config.json",
        ["num_key_value_heads"],
    ),
    ("unsupported act", {**LLAMA, "hidden_act": "gelu"}, {}, "config.json", ["hidden_act"]),
    (
        "bad generation_config",
        LLAMA,
        {"generation_config.json": "{"},
        "generation_config.json",
        ["not valid JSON"],
    ),
    (
        "bad eos",
        LLAMA,
        {"generation_config.json": {"eos_token_id": "x"}},
        "generation_config.json",
        ["eos_token_id"],
    ),
    (
        "sentence-transformers Dense head",
        BERT,
        {"modules.json": [{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}]},
        "modules.json",
        ["Dense"],
    ),
    (
        "pooling weightedmean",
        BERT,
        {
            "modules.json": [{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}],
            "1_Pooling__config.json": {"pooling_mode_weightedmean_tokens": True},
        },
        "config.json",
        ["weightedmean"],
    ),
]


@pytest.mark.parametrize(
    ("config", "files", "file", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refused(tmp_path: Path, config: Any, files: dict[str, Any], file: str, words: list[str]) -> None:
    with pytest.raises(CheckpointError) as info:
        load_model_config(write(tmp_path / "m", config, **files))
    assert info.value.path.name == file
    for word in words:
        assert word in str(info.value)


def test_missing_directory_and_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model_config(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError) as info:
        load_model_config(tmp_path / "empty")
    assert str(info.value) == f"{tmp_path / 'empty' / 'config.json'}: file not found"


SYNTHETIC = [
    # (conftest fixture, expected fields of the checkpoint transformers wrote)
    (
        "llama_gqa_dir",
        {
            "architecture": "LlamaForCausalLM",
            "num_key_value_heads": 2,
            "tie_word_embeddings": False,
            "rope_scaling": None,
            "eos_token_ids": frozenset({2}),
            "bos_token_id": 1,
        },
    ),
    ("llama_tied_dir", {"tie_word_embeddings": True}),
    ("qwen2_dir", {"architecture": "Qwen2ForCausalLM", "attention_bias": True, "sliding_window": None}),
    ("mistral_dir", {"architecture": "MistralForCausalLM", "sliding_window": None, "max_model_len": 1024}),
    (
        "llama3_rope_dir",
        {
            "rope_theta": 10000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
        },
    ),
]


@pytest.mark.parametrize(("fixture", "expected"), SYNTHETIC, ids=[c[0] for c in SYNTHETIC])
def test_synthetic_checkpoints(
    request: pytest.FixtureRequest, fixture: str, expected: dict[str, Any]
) -> None:
    parsed = load_model_config(request.getfixturevalue(fixture))
    assert isinstance(parsed, DecoderConfig)
    assert (parsed.vocab_size, parsed.hidden_size, parsed.num_hidden_layers) == (512, 64, 2)
    assert {k: getattr(parsed, k) for k in expected} == expected
