"""models/linear.py: the oneDNN product equals F.linear, whatever the weight's layout, bias or dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.worker.models.linear import Linear, linear


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("layout", ["row-major", "column-major", "row-slice"])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_equals_f_linear(rows: int, layout: str, bias: bool) -> None:
    torch.manual_seed(rows)
    x = torch.randn(rows, 96)
    weight = torch.randn(200, 96)
    if layout == "column-major":
        weight = weight.t().contiguous().t()  # as weight_order lays out an untied LM head
    elif layout == "row-slice":
        weight = weight[40:170]  # a vocabulary slice of the LM head: contiguous rows
    b = torch.randn(weight.shape[0]) if bias else None
    torch.testing.assert_close(linear(x, weight, b), F.linear(x, weight, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_other_dtypes_keep_f_linear(dtype: torch.dtype) -> None:
    x, weight = torch.randn(8, 32, dtype=dtype), torch.randn(16, 32, dtype=dtype)
    assert torch.equal(linear(x, weight), F.linear(x, weight))


def test_linear_module_keeps_nn_linear_state_dict() -> None:
    module = Linear(32, 16, bias=True)
    reference = torch.nn.Linear(32, 16, bias=True)
    reference.load_state_dict(module.state_dict())
    x = torch.randn(5, 32)
    torch.testing.assert_close(module(x), reference(x), rtol=1e-5, atol=1e-5)
