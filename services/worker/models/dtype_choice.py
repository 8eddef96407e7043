"""dtype "auto": the checkpoint's own dtype on CUDA; on CPU whichever of float32 and bfloat16 runs
this model's matrix products faster on this machine, measured, since CPUs differ widely (bfloat16 is
several times faster with AMX or AVX512-BF16, and several times slower without them)."""

from __future__ import annotations

import functools
import logging
import time

import torch

from services.worker.models.config_types import DecoderConfig, EncoderConfig

log = logging.getLogger(__name__)

AUTO = "auto"
_CUDA_FALLBACK = "bfloat16"  # a checkpoint that names no dtype (a GGUF file's are quantized)
_TIMED_ROWS = (1, 32, 256)  # a decode step's rows, a small batch's, a prefill chunk's
_MIN_GAIN = 1.1  # bfloat16 must be this much faster: its rounding is a cost of its own


def resolve_dtype(requested: str, device: str, config: DecoderConfig | EncoderConfig) -> str:
    """requested unless it is "auto"; then (see the module docstring) the dtype name to load in."""
    if requested != AUTO:
        return requested
    if device.startswith("cuda"):
        own = getattr(config, "torch_dtype", None)  # encoder configs keep none
        return own if own in ("float32", "bfloat16", "float16") else _CUDA_FALLBACK
    return faster_on_cpu(config.hidden_size, config.intermediate_size)


@functools.cache
def faster_on_cpu(hidden: int, intermediate: int) -> str:
    """The faster of float32 / bfloat16 for [rows, hidden] x [hidden, intermediate] products (the MLP's
    shape), summed over a decode's, a batch's and a prefill chunk's row counts; measured once per shape
    and process (about 0.1-0.5 s)."""
    took = {
        name: _time_linear(getattr(torch, name), hidden, intermediate) for name in ("float32", "bfloat16")
    }
    choice = "bfloat16" if took["bfloat16"] * _MIN_GAIN < took["float32"] else "float32"
    log.info(
        "dtype auto -> %s on cpu (%dx%d products: float32 %.2f ms, bfloat16 %.2f ms)",
        choice, hidden, intermediate, took["float32"] * 1e3, took["bfloat16"] * 1e3,
    )  # fmt: skip
    return choice


def _time_linear(dtype: torch.dtype, hidden: int, intermediate: int) -> float:
    """Seconds for one product at each of _TIMED_ROWS, the best of a few runs (the least disturbed)."""
    weight = torch.randn(intermediate, hidden, dtype=dtype)
    inputs = [torch.randn(rows, hidden, dtype=dtype) for rows in _TIMED_ROWS]
    best = float("inf")
    with torch.inference_mode():
        for x in inputs:
            torch.nn.functional.linear(x, weight)  # warm up: first calls pick kernels and fault pages in
        for _ in range(3):
            start = time.perf_counter()
            for x in inputs:
                torch.nn.functional.linear(x, weight)
            best = min(best, time.perf_counter() - start)
    return best
