"""Memory order of weights, chosen per device: a model names the 2-D weights its kernels read faster
column-major on CPU, and every path that gives a model storage (to_empty, arena views) applies it before
the weights are copied in, so checkpoint loads, host copies and reloads all see the same bytes."""

from __future__ import annotations

import torch
from torch import nn


def column_major_on(model: nn.Module, device: torch.device) -> None:
    """Re-stride, in place, the weights model.column_major_weights() names when device is a CPU: same
    bytes and logical shape [out, in], laid out as the transpose [in, out]. Contents are not kept (call
    before loading them); a weight already column-major is left alone."""
    if device.type != "cpu":
        return
    names = getattr(model, "column_major_weights", None)
    for name in names() if callable(names) else ():
        param = model.get_parameter(name)
        if param.dim() == 2 and param.is_contiguous():
            rows, cols = param.shape
            param.data = param.data.view(cols, rows).t()
