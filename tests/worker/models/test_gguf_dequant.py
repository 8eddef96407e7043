"""Our whole-tensor dequantization gives gguf.quants.dequantize's values bit for bit, for the types we
decode ourselves and for those we pass on to it; types nobody decodes are reported as such."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from services.worker.models.gguf_dequant import can_dequantize, dequantize_tensor

Q = GGMLQuantizationType
SHAPE = (48, 512)  # 512 columns: whole blocks of 32 and of 256 (the K-quants)


def _stored(kind: GGMLQuantizationType) -> np.ndarray:
    """SHAPE's worth of stored bytes of kind: quantized from random values where gguf can quantize
    kind, else random bytes (their float16 scales may be inf/NaN, which both decoders must agree on)."""
    rng = np.random.default_rng(int(kind))
    values = rng.standard_normal(SHAPE, dtype=np.float32)
    if kind == Q.F32:
        return values.view(np.uint8).reshape(-1)
    if kind == Q.F16:
        return values.astype(np.float16).view(np.uint8).reshape(-1)
    if kind in (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
        return quantize(values, kind).reshape(-1)
    block_size, type_size = GGML_QUANT_SIZES[kind]
    return rng.integers(0, 256, SHAPE[0] * SHAPE[1] // block_size * type_size, dtype=np.uint8)


DECODED = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K]


@pytest.mark.parametrize("kind", DECODED, ids=lambda kind: kind.name)
def test_values_equal_gguf_s(kind: GGMLQuantizationType) -> None:
    raw = _stored(kind)
    with np.errstate(all="ignore"):  # random K-quant scales include inf and NaN
        expected = dequantize(raw.reshape(SHAPE[0], -1), kind).astype(np.float32)
        got = dequantize_tensor(raw.copy(), kind, SHAPE)
    assert got.dtype == torch.float32 and tuple(got.shape) == SHAPE and got.is_contiguous()
    assert np.array_equal(got.numpy(), expected, equal_nan=True)
    assert can_dequantize(kind)


def test_result_does_not_alias_the_stored_bytes() -> None:
    raw = _stored(Q.F32)
    got = dequantize_tensor(raw, Q.F32, SHAPE)
    raw[:] = 0  # the caller reuses its buffer
    assert got.abs().sum() > 0


@pytest.mark.parametrize("kind", [Q.I8, Q.I16, Q.I32, Q.I64, Q.F64], ids=lambda kind: kind.name)
def test_types_nobody_decodes_are_reported(kind: GGMLQuantizationType) -> None:
    assert not can_dequantize(kind)


def test_a_size_that_does_not_fit_the_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="do not hold Q8_0 values of shape"):
        dequantize_tensor(np.zeros(33, dtype=np.uint8), Q.Q8_0, (32,))
