"""The model's matrix products on CPU through oneDNN, the library vLLM's CPU backend uses for them.

torch's F.linear on CPU calls MKL's sgemm, which on the AMD EPYC cores measured here runs a serving
step's shapes at a third to a half of oneDNN's rate (SmolLM2's gate/up product for 64 decode rows:
6.9 ms against 2.2; its 49152-entry LM head: 64 ms against 39). torch ships oneDNN and exposes its
linear as torch.ops.mkldnn._linear_pointwise (the kernel Inductor's CPU code calls), taking and giving
ordinary dense tensors. It is used for float32 on CPU with a row-major weight; everything else (CUDA,
other dtypes, a column-major weight laid out for MKL by weight_order) keeps F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias, as F.linear (x [..., in], weight [out, in]), by the faster kernel for it."""
    if _ONEDNN and x.dtype == torch.float32 and x.device.type == "cpu" and weight.is_contiguous():
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear whose product goes through linear() (same parameters, same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
