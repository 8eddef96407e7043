"""Dequantizing one GGUF tensor's stored bytes to float32.

The float types and the simple block formats small models ship in (Q8_0, Q4_0, Q4_1) are decoded here
over the whole tensor at once; every other type goes to gguf.quants.dequantize. That one is vectorised
only over 16-row groups, with a Python-level split and concatenation per group: for SmolLM2-135M
(Q4_1 + Q8_0) it took 2.8-4.4 s where one whole-tensor pass takes 1.1-1.6 s (2 busy cores). Both are
numpy, single-threaded on purpose: torch's intra-op threads made the same decode 10-17 s on a loaded
2-core machine. The arithmetic is gguf's own, so the values are bit for bit the same.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize


def dequantize_array(raw: np.ndarray, ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """C-contiguous float32 array of shape (torch order) from raw, the tensor's stored bytes (uint8,
    exactly its size), in memory of its own. ValueError for a size that does not fit shape;
    NotImplementedError for a type neither we nor gguf decode (see can_dequantize)."""
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    count = int(np.prod(shape)) if shape else 1
    if raw.size != count // block_size * type_size or count % block_size:
        raise ValueError(f"{raw.size} bytes do not hold {ggml_type.name} values of shape {list(shape)}")
    whole = _WHOLE.get(ggml_type)
    if whole is not None:
        # One block per row of a [blocks, type_size] byte matrix: the formats below are all per block.
        values = whole(raw.reshape(-1, type_size))
    else:
        cols = shape[-1] if shape else 1
        values = dequantize(raw.reshape(*shape[:-1], cols // block_size * type_size), ggml_type)
    return np.ascontiguousarray(values, dtype=np.float32).reshape(shape)


def dequantize_tensor(
    raw: np.ndarray, ggml_type: GGMLQuantizationType, shape: tuple[int, ...]
) -> torch.Tensor:
    """dequantize_array as a float32 CPU torch tensor (sharing the array's memory)."""
    return torch.from_numpy(dequantize_array(raw, ggml_type, shape))


@cache
def can_dequantize(ggml_type: GGMLQuantizationType) -> bool:
    """Whether dequantize_tensor decodes ggml_type. Types without a torch path are probed on one zero
    block, since gguf.quants raises NotImplementedError for types it only names (integers, new formats)."""
    if ggml_type in _WHOLE:
        return True
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    try:
        out = dequantize(np.zeros((1, type_size), dtype=np.uint8), ggml_type)
    except (NotImplementedError, ValueError, TypeError):
        return False
    return out.dtype in (np.float32, np.float16) and out.size == block_size


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 scale at byte start of every block, as a float32 column [blocks, 1]."""
    return blocks[:, start : start + 2].view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[blocks, 16] packed bytes -> [blocks, 32] values 0..15: low nibbles are elements 0..15, high ones
    16..31 (ggml's layout)."""
    out = np.empty((qs.shape[0], 2 * qs.shape[1]), dtype=np.uint8)
    np.bitwise_and(qs, 0x0F, out=out[:, : qs.shape[1]])
    np.right_shift(qs, 4, out=out[:, qs.shape[1] :])
    return out


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    # d (f16), 32 x int8: x * d, as gguf.quants.Q8_0 computes it (in place: one float32 tensor at peak).
    values = blocks[:, 2:].view(np.int8).astype(np.float32)
    values *= _half(blocks, 0)
    return values


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    # d (f16), 16 packed bytes: (q - 8) * d.
    values = _nibbles(blocks[:, 2:]).astype(np.float32)
    values -= 8
    values *= _half(blocks, 0)
    return values


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    # d (f16), m (f16), 16 packed bytes: d * q + m.
    values = _nibbles(blocks[:, 4:]).astype(np.float32)
    values *= _half(blocks, 0)
    values += _half(blocks, 2)
    return values


def _bf16(blocks: np.ndarray) -> np.ndarray:
    # bfloat16 is the top half of a float32: shift the 16 bits up (numpy has no bfloat16).
    return (blocks.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


_WHOLE: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    # F32: a copy, since raw's buffer is the caller's.
    GGMLQuantizationType.F32: lambda b: b.view(np.float32).copy(),
    GGMLQuantizationType.F16: lambda b: b.view(np.float16).astype(np.float32),
    GGMLQuantizationType.BF16: _bf16,
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
}
