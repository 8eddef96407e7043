"""A GGUF file's tensors as the Hugging Face Llama checkpoint would hold them: HF names, float32, and
q/k rows back in HF order. Same contract as checkpoint.iter_safetensors, so load_weights takes either."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from services.worker.models.errors import CheckpointError
from services.worker.models.gguf_dequant import can_dequantize, dequantize_array
from services.worker.models.gguf_file import GGUFFile, GGUFTensor, read_gguf, read_tensor_bytes

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# blk.N.<gguf> -> model.layers.N.<hf>, for .weight and .bias alike.
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# llama.cpp permutes q/k rows for its interleaved RoPE only in the architectures that use it; Qwen2's
# RoPE is llama.cpp's NEOX kind, the half-split layout HF uses, so its rows are stored as HF has them.
_PERMUTED_ARCHITECTURES = frozenset({"llama"})
ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)


def hf_tensor_name(gguf_name: str) -> str | None:
    """The HF Llama name of a llama.cpp tensor name ('blk.3.attn_q.weight' ->
    'model.layers.3.self_attn.q_proj.weight'); None for a name with no Llama equivalent."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK.fullmatch(gguf_name)
    if match is None or match[2] not in _BLOCK_NAMES:
        return None
    return f"model.layers.{match[1]}.{_BLOCK_NAMES[match[2]]}.{match[3]}"


def iter_gguf(source: str | Path | GGUFFile) -> Iterator[tuple[str, str, torch.Tensor]]:
    """Yield (file path, HF tensor name, float32 CPU tensor) one tensor at a time, in file order: peak
    host memory is about one dequantized tensor. source: a .gguf path or an already parsed GGUFFile.
    CheckpointError naming the file, raised before anything is yielded, for a tensor with no Llama
    name or of a type we cannot dequantize; also for a file that cannot be read."""
    gguf = source if isinstance(source, GGUFFile) else read_gguf(source)
    names = check_gguf_tensors(gguf)
    heads = _rope_heads(gguf)
    file = str(gguf.path)
    with gguf.path.open("rb") as f:
        for tensor in gguf.tensors.values():
            values = _dequantized(gguf.path, tensor, read_tensor_bytes(f, gguf.path, tensor))
            name = names[tensor.name]
            n_head = None if heads is None else heads.get(name.rsplit(".", 2)[-2])
            if n_head is not None:
                try:
                    values = np.ascontiguousarray(unpermute_rope_rows(values, n_head))
                except ValueError as err:
                    raise CheckpointError(gguf.path, f"tensor {tensor.name!r}: {err}") from err
            # numpy up to here: single-threaded, where torch's intra-op threads measured several times
            # slower on a busy 2-core machine; from_numpy shares the memory, copying nothing.
            yield file, name, torch.from_numpy(values)


def check_gguf_tensors(gguf: GGUFFile) -> dict[str, str]:
    """{GGUF name: HF name} for every tensor in gguf, reading no tensor data; CheckpointError naming the
    file for a tensor with no Llama name or of a type we cannot dequantize. Cheap: call it before
    reserving memory for a model so a bad file fails first."""
    return {tensor.name: _checked_name(gguf, tensor) for tensor in gguf.tensors.values()}


def unpermute_rope_rows(weight: ArrayT, n_head: int) -> ArrayT:
    """Undo llama.cpp's q/k permutation (convert_hf_to_gguf's LlamaModel.permute), which reorders each
    head's rows from HF's half-split RoPE layout (x0..x31, y0..y31) to ggml's interleaved pairs
    (x0, y0, x1, y1, ...): w.reshape(n_head, 2, rows/n_head/2, ...).swapaxes(1, 2). Works for a
    weight [rows, cols] and a bias [rows], numpy or torch; ValueError if rows is not a multiple of
    2 * n_head."""
    rows = weight.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"{rows} rows do not split into {n_head} heads of pairs")
    tail = tuple(weight.shape[1:])
    return weight.reshape(n_head, rows // n_head // 2, 2, *tail).swapaxes(1, 2).reshape(rows, *tail)


def _checked_name(gguf: GGUFFile, tensor: GGUFTensor) -> str:
    """tensor's HF name, after checking we can dequantize its type (both before loading anything)."""
    name = hf_tensor_name(tensor.name)
    if name is None:
        problem = f"unexpected tensor {tensor.name!r}: no Llama equivalent (is {gguf.architecture!r} right?)"
        raise CheckpointError(gguf.path, problem)
    if not can_dequantize(tensor.ggml_type):
        problem = f"tensor {tensor.name!r} has type {tensor.ggml_type.name}, which we cannot dequantize"
        raise CheckpointError(gguf.path, problem)
    return name


def _dequantized(path: Path, tensor: GGUFTensor, raw: np.ndarray) -> np.ndarray:
    try:
        return dequantize_array(raw, tensor.ggml_type, tensor.shape)
    except (ValueError, NotImplementedError) as err:
        raise CheckpointError(path, f"cannot dequantize tensor {tensor.name!r} ({err})") from err


def _rope_heads(gguf: GGUFFile) -> dict[str, int] | None:
    """{HF projection: heads} to undo the q/k permutation with; None where the architecture stores no
    permutation. The k permutation uses the kv head count, as llama.cpp's converter does under GQA."""
    if gguf.architecture not in _PERMUTED_ARCHITECTURES:
        return None
    prefix = gguf.architecture
    heads = gguf.metadata.get(f"{prefix}.attention.head_count")
    kv_heads = gguf.metadata.get(f"{prefix}.attention.head_count_kv") or heads
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads <= 0 or kv_heads <= 0:
        raise CheckpointError(gguf.path, f"missing or invalid metadata '{prefix}.attention.head_count'")
    return {"q_proj": heads, "k_proj": kv_heads}
