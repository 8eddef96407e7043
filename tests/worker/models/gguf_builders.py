"""Small GGUF files for tests, written with gguf.GGUFWriter the way llama.cpp's converter writes them:
from a tiny synthetic Hugging Face checkpoint (tensor names by gguf's own name map, q/k rows permuted
for llama), or from scratch with whatever metadata and tensors a bad-file case needs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file

_ARCHS = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2}


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim: HF half-split rows -> interleaved pairs."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_from_hf_dir(
    model_dir: Path,
    out: Path,
    *,
    arch: str = "llama",
    quant: gguf.GGMLQuantizationType | None = None,
    with_tokenizer: bool = True,
) -> Path:
    """Convert a synthetic HF checkpoint (one model.safetensors) to out, as llama.cpp would. quant: store
    2-D weights in that type (F32 otherwise); with_tokenizer: tokenizer.json's byte-level BPE as
    tokenizer.ggml.* metadata, its specials as control tokens, BOS added as the HF tokenizer does."""
    cfg = json.loads((model_dir / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    writer = gguf.GGUFWriter(out, arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]  # transformers >= 5 nests it
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    writer.add_vocab_size(cfg["vocab_size"])
    if with_tokenizer:
        _add_tokenizer(writer, model_dir)
    names = gguf.get_tensor_name_map(_ARCHS[arch], cfg["num_hidden_layers"])
    for hf_name, tensor in load_file(str(model_dir / "model.safetensors")).items():
        if hf_name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        data = tensor.astype(np.float32)
        if arch == "llama" and name.endswith("attn_q.weight"):
            data = llama_cpp_permute(data, heads)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            data = llama_cpp_permute(data, kv_heads)
        if quant is not None and data.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
        else:
            writer.add_tensor(name, data)
    _finish(writer)
    return out


def write_gguf(
    out: Path,
    arch: str = "llama",
    metadata: Mapping[str, Any] | None = None,
    tensors: Mapping[str, np.ndarray | tuple[np.ndarray, gguf.GGMLQuantizationType]] | None = None,
) -> Path:
    """A GGUF at out with general.architecture arch, the given metadata (typed by GGUFWriter from the
    Python value: int -> UINT32, float -> FLOAT32, bool, str, list) and tensors (an array, or raw bytes
    with their ggml type)."""
    writer = gguf.GGUFWriter(out, arch)
    for key, value in (metadata or {}).items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, value)
    for name, tensor in (tensors or {}).items():
        if isinstance(tensor, tuple):
            writer.add_tensor(name, tensor[0], raw_dtype=tensor[1])
        else:
            writer.add_tensor(name, tensor)
    _finish(writer)
    return out


TINY_VOCAB, TINY_HIDDEN, TINY_FFN, TINY_HEADS, TINY_KV_HEADS = 32, 64, 128, 4, 2


def tiny_model_gguf(
    out: Path,
    arch: str = "llama",
    metadata: Mapping[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    extra: Mapping[str, np.ndarray | tuple[np.ndarray, gguf.GGMLQuantizationType]] | None = None,
) -> Path:
    """A valid 1-layer, 64-wide random model with F32 tensors and no tokenizer, written from scratch.
    metadata: keys to add or override (a value of None removes the key); drop: tensor names to leave
    out; extra: tensors to add or replace."""
    prefix = arch
    meta: dict[str, Any] = {
        f"{prefix}.block_count": 1,
        f"{prefix}.context_length": 128,
        f"{prefix}.embedding_length": TINY_HIDDEN,
        f"{prefix}.feed_forward_length": TINY_FFN,
        f"{prefix}.attention.head_count": TINY_HEADS,
        f"{prefix}.attention.head_count_kv": TINY_KV_HEADS,
        f"{prefix}.attention.layer_norm_rms_epsilon": 1e-5,
        "tokenizer.ggml.eos_token_id": 2,
    }
    meta.update(metadata or {})
    rng = np.random.default_rng(0)
    kv = TINY_HIDDEN // TINY_HEADS * TINY_KV_HEADS
    shapes = {  # torch order [out, in]; GGUFWriter takes numpy arrays in that order too
        "token_embd.weight": (TINY_VOCAB, TINY_HIDDEN),
        "output_norm.weight": (TINY_HIDDEN,),
        "blk.0.attn_norm.weight": (TINY_HIDDEN,),
        "blk.0.ffn_norm.weight": (TINY_HIDDEN,),
        "blk.0.attn_q.weight": (TINY_HIDDEN, TINY_HIDDEN),
        "blk.0.attn_k.weight": (kv, TINY_HIDDEN),
        "blk.0.attn_v.weight": (kv, TINY_HIDDEN),
        "blk.0.attn_output.weight": (TINY_HIDDEN, TINY_HIDDEN),
        "blk.0.ffn_gate.weight": (TINY_FFN, TINY_HIDDEN),
        "blk.0.ffn_up.weight": (TINY_FFN, TINY_HIDDEN),
        "blk.0.ffn_down.weight": (TINY_HIDDEN, TINY_FFN),
    }
    tensors: dict[str, Any] = {
        name: rng.standard_normal(shape, dtype=np.float32)
        for name, shape in shapes.items()
        if name not in drop
    }
    tensors.update(extra or {})
    return write_gguf(out, arch, {k: v for k, v in meta.items() if v is not None}, tensors)


def _add_tokenizer(writer: gguf.GGUFWriter, model_dir: Path) -> None:
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    specials = {t["content"] for t in spec["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab["<s>"])
    writer.add_eos_token_id(vocab["</s>"])
    writer.add_unk_token_id(vocab["<unk>"])
    writer.add_add_bos_token(True)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
