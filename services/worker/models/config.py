"""Model configs (config_types.py) parsed from a Hugging Face checkpoint directory (config.json and
friends), or from a GGUF file's metadata (gguf_config.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.worker.models.config_types import DecoderConfig, EncoderConfig
from services.worker.models.errors import CheckpointError
from services.worker.models.gguf_config import gguf_decoder_config
from services.worker.models.gguf_file import is_gguf_path, read_gguf

DECODER_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})
ENCODER_ARCHITECTURES = frozenset({"BertModel", "BertForMaskedLM", "BertForPreTraining"})
# Used only when config.json has no "architectures" list (some hand-written configs).
_MODEL_TYPE_FALLBACK = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "bert": "BertModel",
}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}
_ENCODER_ACTS = frozenset({"gelu", "gelu_new", "gelu_pytorch_tanh", "relu"})


def load_model_config(model_dir: Path) -> DecoderConfig | EncoderConfig:
    """Parse model_dir/config.json (+ generation_config.json or sentence-transformers files), or, when
    model_dir is a GGUF file (gguf_file.is_gguf_path), that file's metadata.

    Raises CheckpointError naming the file for a missing directory or file, invalid JSON, a missing or
    ill-typed key, or an architecture or option we do not implement.
    """
    model_dir = Path(model_dir)
    if is_gguf_path(model_dir):
        return gguf_decoder_config(read_gguf(model_dir))
    if not model_dir.is_dir():
        raise CheckpointError(model_dir, "model directory does not exist")
    path = model_dir / "config.json"
    cfg = read_json(path, required=True)
    arch = _architecture(path, cfg)
    if arch in DECODER_ARCHITECTURES:
        return _decoder_config(model_dir, path, cfg, arch)
    return _encoder_config(model_dir, path, cfg, arch)


def read_json(path: Path, *, required: bool) -> dict[str, Any]:
    """The JSON object in path; {} if the file is absent and not required. CheckpointError otherwise."""
    if not path.is_file():
        if required:
            raise CheckpointError(path, "file not found")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(path, f"not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise CheckpointError(path, f"expected a JSON object, got {type(data).__name__}")
    return data


def _architecture(path: Path, cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures")
    if archs is None and cfg.get("model_type") in _MODEL_TYPE_FALLBACK:
        return _MODEL_TYPE_FALLBACK[cfg["model_type"]]
    if not isinstance(archs, list) or not archs:
        raise CheckpointError(path, "missing required key 'architectures'")
    for arch in archs:
        if arch in DECODER_ARCHITECTURES or arch in ENCODER_ARCHITECTURES:
            return arch
    supported = sorted(DECODER_ARCHITECTURES | ENCODER_ARCHITECTURES)
    raise CheckpointError(path, f"unknown architectures {archs}; supported: {', '.join(supported)}")


def _int(path: Path, cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise CheckpointError(path, f"missing required key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(path, f"key {key!r} must be a positive integer, got {value!r}")
    return value


def _float(path: Path, cfg: dict[str, Any], key: str, default: float) -> float:
    value = cfg.get(key)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise CheckpointError(path, f"key {key!r} must be a positive number, got {value!r}")
    return float(value)


def _token_ids(path: Path, value: Any) -> frozenset[int]:
    values = [] if value is None else value if isinstance(value, list) else [value]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise CheckpointError(path, f"eos_token_id must be an integer or a list of integers, got {value!r}")
    return frozenset(values)


def _rope(path: Path, cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    # transformers < 5 writes rope_theta + rope_scaling; >= 5 folds both into rope_parameters.
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError(path, f"rope_scaling must be an object or null, got {params!r}")
    theta = _float(path, {"rope_theta": cfg.get("rope_theta", params.get("rope_theta"))}, "rope_theta", 1e4)
    kind = params.get("rope_type", params.get("type"))
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        raise CheckpointError(path, f"unsupported rope scaling type {kind!r}; supported: default, llama3")
    missing = [k for k in _LLAMA3_KEYS if params.get(k) is None]
    if missing:
        raise CheckpointError(path, f"rope scaling 'llama3' is missing {', '.join(missing)}")
    scaling: dict[str, Any] = {"rope_type": "llama3"}
    scaling.update({k: float(params[k]) for k in _LLAMA3_KEYS[:3]})
    scaling["original_max_position_embeddings"] = _int(path, params, "original_max_position_embeddings")
    return theta, scaling


def _decoder_config(model_dir: Path, path: Path, cfg: dict[str, Any], arch: str) -> DecoderConfig:
    model_type = str(cfg.get("model_type", ""))
    if cfg.get("hidden_act", "silu") != "silu":
        raise CheckpointError(path, f"unsupported hidden_act {cfg['hidden_act']!r}; supported: silu")
    hidden, heads = _int(path, cfg, "hidden_size"), _int(path, cfg, "num_attention_heads")
    kv_heads = _int(path, cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise CheckpointError(
            path, f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    if cfg.get("head_dim") is None and hidden % heads:
        raise CheckpointError(path, f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    head_dim = _int(path, cfg, "head_dim", hidden // heads)
    max_pos = _int(path, cfg, "max_position_embeddings")
    # Qwen2 configs carry a sliding_window value even when use_sliding_window is false (then unused).
    window = cfg.get("sliding_window")
    if arch == "LlamaForCausalLM" or (arch == "Qwen2ForCausalLM" and not cfg.get("use_sliding_window")):
        window = None
    if window is not None:
        window = _int(path, cfg, "sliding_window")
    theta, scaling = _rope(path, cfg)
    gen_path = model_dir / "generation_config.json"
    gen = read_json(gen_path, required=False)
    if gen.get("eos_token_id") is not None:
        eos = _token_ids(gen_path, gen["eos_token_id"])
    else:
        eos = _token_ids(path, cfg.get("eos_token_id"))
    bos = gen.get("bos_token_id", cfg.get("bos_token_id"))
    is_qwen2 = arch == "Qwen2ForCausalLM"
    attention_bias = bool(cfg.get("attention_bias", False)) or is_qwen2
    return DecoderConfig(
        architecture=arch,
        model_type=model_type,
        vocab_size=_int(path, cfg, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_int(path, cfg, "intermediate_size"),
        num_hidden_layers=_int(path, cfg, "num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_float(path, cfg, "rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=max_pos,
        max_model_len=min(max_pos, window) if window else max_pos,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=attention_bias,
        o_proj_bias=attention_bias and not is_qwen2,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        sliding_window=window,
        torch_dtype=cfg.get("torch_dtype", cfg.get("dtype")),
        eos_token_ids=eos,
        bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
    )


def _encoder_config(model_dir: Path, path: Path, cfg: dict[str, Any], arch: str) -> EncoderConfig:
    act = cfg.get("hidden_act", "gelu")
    if act not in _ENCODER_ACTS:
        supported = ", ".join(sorted(_ENCODER_ACTS))
        raise CheckpointError(path, f"unsupported hidden_act {act!r}; supported: {supported}")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(path, f"unsupported position_embedding_type {cfg['position_embedding_type']!r}")
    hidden, heads = _int(path, cfg, "hidden_size"), _int(path, cfg, "num_attention_heads")
    if hidden % heads:
        raise CheckpointError(path, f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    max_pos = _int(path, cfg, "max_position_embeddings")
    pooling, normalize = _sentence_transformers_head(model_dir)
    st_path = model_dir / "sentence_bert_config.json"
    max_seq = read_json(st_path, required=False).get("max_seq_length") or max_pos
    pad = cfg.get("pad_token_id")
    return EncoderConfig(
        architecture=arch,
        vocab_size=_int(path, cfg, "vocab_size"),
        hidden_size=hidden,
        num_hidden_layers=_int(path, cfg, "num_hidden_layers"),
        num_attention_heads=heads,
        intermediate_size=_int(path, cfg, "intermediate_size"),
        hidden_act=act,
        layer_norm_eps=_float(path, cfg, "layer_norm_eps", 1e-12),
        max_position_embeddings=max_pos,
        type_vocab_size=_int(path, cfg, "type_vocab_size", 2),
        pad_token_id=pad if isinstance(pad, int) and pad >= 0 else 0,
        pooling=pooling,
        normalize=normalize,
        max_seq_length=min(int(max_seq), max_pos),
    )


def _sentence_transformers_head(model_dir: Path) -> tuple[str, bool]:
    """(pooling, normalize) from modules.json + the pooling module's config; ("mean", True) if absent."""
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return "mean", True
    try:
        modules = json.loads(modules_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(modules_path, f"not valid JSON ({err})") from err
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(modules_path, "expected a JSON list of module objects")
    pooling, normalize = "mean", False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Normalize":
            normalize = True
        elif kind == "Pooling":
            pooling = _pooling_mode(model_dir / str(module.get("path", "")) / "config.json")
        elif kind != "Transformer":
            # A Dense or other head changes the embedding; silently skipping it would return wrong vectors.
            raise CheckpointError(
                modules_path,
                f"unsupported sentence-transformers module {kind!r}; "
                "supported: Transformer, Pooling, Normalize",
            )
    return pooling, normalize


def _pooling_mode(path: Path) -> str:
    cfg = read_json(path, required=False)
    if not cfg:
        return "mean"
    if cfg.get("pooling_mode"):
        mode = {"mean": "mean", "cls": "cls", "max": "max"}.get(cfg["pooling_mode"])
        if mode is None:
            problem = f"unsupported pooling_mode {cfg['pooling_mode']!r}; supported: mean, cls, max"
            raise CheckpointError(path, problem)
        return mode
    modes = [mode for key, mode in _POOLING_MODES.items() if cfg.get(key)]
    others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in _POOLING_MODES]
    if others or len(modes) != 1:
        keys = ", ".join(_POOLING_MODES)
        raise CheckpointError(path, f"unsupported pooling {others or modes}: one of {keys} must be true")
    return modes[0]
