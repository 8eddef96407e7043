"""models/linear.py: the oneDNN product equals F.linear, whatever the weight's layout, bias or dtype;
so do the packed weights, in a model and in the engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from services.worker.engine import LLM, SamplingParams
from services.worker.models import llama
from services.worker.models.linear import Linear, linear, pack, packable, packed_linear
from services.worker.models.loader import load_model
from services.worker.models.preemption import PreemptionPoints


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


# bfloat16 rounds each product's output to 8 bits of mantissa; the two kernels sum in other orders.
PACKED_TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (2e-2, 1e-1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("layout", ["row-major", "column-major"])
def test_packed_weight_gives_the_plain_product(dtype: torch.dtype, rows: int, layout: str) -> None:
    torch.manual_seed(rows)
    x = torch.randn(rows, 96).to(dtype)
    weight = torch.randn(200, 96).to(dtype)
    if layout == "column-major":
        weight = weight.t().contiguous().t()
    bias = torch.randn(200).to(dtype)
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert not packable(weight)  # oneDNN's bfloat16 path needs AVX-512 or AVX-NE-CONVERT
        pytest.skip("this CPU has no oneDNN bfloat16 path")
    assert packable(weight)
    expected = F.linear(x.float(), weight.float(), bias.float())
    rtol, atol = PACKED_TOLERANCE[dtype]
    torch.testing.assert_close(packed_linear(x, pack(weight), bias).float(), expected, rtol=rtol, atol=atol)


def test_half_precision_and_cuda_weights_are_not_packed() -> None:
    assert not packable(torch.randn(16, 32, dtype=torch.float16))
    assert not packable(torch.randn(16, dtype=torch.float32))  # not a matrix


def test_a_packed_model_computes_what_the_plain_one_does(
    llama_tied_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every product, and the LM head in vocabulary slices (as under layer preemption), through the
    packed copies; unpacking returns to the plain weights."""
    monkeypatch.setattr(llama, "VOCAB_PER_SLICE", 100)  # the tiny vocabulary in several slices
    model = load_model(llama_tied_dir, torch.float32, torch.device("cpu")).model
    hidden = torch.randn(5, model.config.hidden_size)
    plain_sliced = model.compute_logits(hidden, preemption=PreemptionPoints(lambda: None))
    plain = model.compute_logits(hidden)
    added = model.pack_weights()
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(m.packed is not None for m in linears) and model._head_slices
    weights = sum(m.weight.numel() * 4 for m in linears) + model.lm_head.weight.numel() * 4
    assert added == weights  # the products' weights, and the head once more in slices
    torch.testing.assert_close(model.compute_logits(hidden), plain, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(
        model.compute_logits(hidden, preemption=PreemptionPoints(lambda: None)),
        plain_sliced,
        rtol=1e-5,
        atol=1e-4,
    )
    model.unpack_weights()
    assert all(m.packed is None for m in linears) and not model._head_slices


def test_engine_packs_on_cpu_unless_told_not_to(llama_gqa_dir: Path) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    packed, plain = LLM(llama_gqa_dir), LLM(llama_gqa_dir, pack_cpu_weights=False)
    assert packed.engine.packed_weight_bytes > 0 and plain.engine.packed_weight_bytes == 0
    prompts = [[5, 9, 13, 2], list(range(3, 40))]
    assert [o.token_ids for o in packed.generate(prompts, greedy)] == [
        o.token_ids for o in plain.generate(prompts, greedy)
    ]
