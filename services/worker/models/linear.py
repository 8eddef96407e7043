"""The model's matrix products on CPU through oneDNN, the library vLLM's CPU backend uses for them.

torch's F.linear on CPU calls MKL's sgemm, which on the AMD EPYC cores measured here runs a serving
step's shapes at a third to a half of oneDNN's rate (SmolLM2's gate/up product for 64 decode rows:
6.9 ms against 2.2; its 49152-entry LM head: 64 ms against 39). torch ships oneDNN and exposes its
linear as torch.ops.mkldnn._linear_pointwise (the kernel Inductor's CPU code calls), taking and giving
ordinary dense tensors. It is used for float32 on CPU with a row-major weight; everything else (CUDA,
other dtypes, a column-major weight laid out for MKL by weight_order) keeps F.linear. So does a forward
being traced by torch.compile: Inductor chooses its own kernel for F.linear (oneDNN on CPU, with the
weights packed once when it freezes them), and cannot lower an explicit oneDNN call on a weight it
does not hold as a constant.

Packed weights (pack_linears): oneDNN reorders a plain weight into its blocked layout on every call,
which for a decode step's few rows costs more than the product itself. A copy packed once
(torch.ops.mkldnn._reorder_linear_weight, as Inductor's CPU freezing does) measured, in bfloat16 for
4 rows on 2 cores: SmolLM2's gate/up 0.18 -> 0.10 ms, its LM head 5.8 -> 1.9 ms; 5-20% at 64-256 rows.
The packed copy is opaque oneDNN memory, so it cannot live in the arena: it is extra host memory the
size of the weights, kept beside them while the model serves (the plain weights stay the source of
truth: host copies, eviction and the embedding lookup of a tied head read those).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# oneDNN's bfloat16 path needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; without them packing raises, and
# bfloat16 weights keep F.linear.
_BF16 = _ONEDNN and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
_PACKABLE = (torch.float32, torch.bfloat16) if _BF16 else (torch.float32,)
PACK_ROWS = 16  # the row count oneDNN is told to expect: decode steps, where packing pays most


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias, as F.linear (x [..., in], weight [out, in]), by the faster kernel for it."""
    if (
        _ONEDNN
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and weight.is_contiguous()
        and not torch.compiler.is_compiling()
    ):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def packable(weight: torch.Tensor) -> bool:
    """True for a 2-D float32 weight on CPU where torch has oneDNN, or bfloat16 where this CPU runs
    oneDNN's bfloat16 path."""
    return _ONEDNN and weight.device.type == "cpu" and weight.dim() == 2 and weight.dtype in _PACKABLE


def pack(weight: torch.Tensor) -> torch.Tensor:
    """An opaque oneDNN copy of weight [out, in] for packed_linear (any memory order)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias for the weight packed by pack()."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class Linear(nn.Linear):
    """nn.Linear whose product goes through linear(), or through its packed weight once pack_linears()
    gave it one (same parameters, same state dict)."""

    packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.packed is not None and x.dtype == self.weight.dtype
        if packed and not torch.compiler.is_compiling():  # see the module docstring on torch.compile
            return packed_linear(x, self.packed, self.bias)
        return linear(x, self.weight, self.bias)


def pack_linears(model: nn.Module) -> int:
    """Give every Linear of model a packed copy of its weight where packable(); the bytes it added.
    Call once the weights hold their final values (packing copies them)."""
    added = 0
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Linear) and packable(module.weight):
                module.packed = pack(module.weight)
                added += module.weight.numel() * module.weight.element_size()
    return added


def unpack_linears(model: nn.Module) -> None:
    """Drop the packed copies (their memory is freed once nothing else holds the model)."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.packed = None


def pack_model(model: nn.Module, name: str) -> int:
    """model.pack_weights() where the model has one (decoders do), logged; the bytes added."""
    pack_weights = getattr(model, "pack_weights", None)
    if not callable(pack_weights):
        return 0
    added = int(pack_weights())
    log.info("%s: weights also packed for oneDNN, %.0f MiB of host memory", name, added / 2**20)
    return added


def unpack_model(model: nn.Module) -> None:
    unpack_weights = getattr(model, "unpack_weights", None)
    if callable(unpack_weights):
        unpack_weights()
