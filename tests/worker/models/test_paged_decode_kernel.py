"""The worker's CPU decode-attention kernel (csrc/paged_decode.cpp) against SDPA over the same contexts,
and the runner choosing it or the grouped PyTorch path. The kernel is compiled here by the same code a
worker runs (make setup builds it first, so this only loads it)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.worker.engine import model_runner
from services.worker.engine.model_runner import ModelRunner
from services.worker.models.cpu_kernels import paged_decode_kernel
from services.worker.models.paged_attention import AttentionMetadata, DecodeGroup, PagedAttention

KERNEL = paged_decode_kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no C++ compiler: the PyTorch path serves")
BLOCK = 16
# Stated tolerances: float32 sums in another order; bfloat16 rounds the output (8 bits of mantissa).
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def scattered_caches(
    lens: list[int], kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K and V caches with random contents and each context's blocks at random, non-adjacent places."""
    gen = torch.Generator().manual_seed(seed)
    widths = [-(-n // BLOCK) for n in lens]
    blocks = sum(widths) * 2 + 1
    shape = (blocks, BLOCK, kv_heads, head_dim)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    order = torch.randperm(blocks, generator=gen).tolist()
    tables = torch.zeros(len(lens), max(widths), dtype=torch.long)
    for row, width in enumerate(widths):
        tables[row, :width] = torch.tensor([order.pop() for _ in range(width)])
    return k, v, tables


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: torch.Tensor, lens: list[int]):
    """Each sequence alone: its context gathered slot by slot, SDPA in float32, heads grouped."""
    out = []
    kv_heads = k.shape[2]
    for row, n in enumerate(lens):
        slots = [int(tables[row, t // BLOCK]) * BLOCK + t % BLOCK for t in range(n)]
        keys = k.view(-1, *k.shape[2:])[slots].float().transpose(0, 1)  # [Hkv, n, D]
        values = v.view(-1, *v.shape[2:])[slots].float().transpose(0, 1)
        query = q[row].float().unsqueeze(1)  # [H, 1, D]
        got = F.scaled_dot_product_attention(query, keys, values, enable_gqa=q.shape[1] != kv_heads)
        out.append(got.squeeze(1))
    return torch.stack(out)


CASES = [
    # heads, kv_heads, head_dim, context lengths (one token, a block edge, several blocks, ragged)
    (9, 3, 64, [1, 16, 17, 100, 333]),
    (4, 4, 32, [5, 64, 2]),
    (8, 1, 128, [40]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "lens"), CASES)
def test_kernel_equals_sdpa_over_each_context(dtype, heads, kv_heads, head_dim, lens) -> None:
    k, v, tables = scattered_caches(lens, kv_heads, head_dim, dtype, seed=len(lens) + heads)
    q = torch.randn(len(lens), heads, head_dim).to(dtype)
    got = KERNEL(q, k, v, tables, torch.tensor(lens), head_dim**-0.5)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), reference(q, k, v, tables, lens), atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_layer_gives_the_same_with_and_without_the_kernel(dtype) -> None:
    """PagedAttention's decode path: one unmasked group through the kernel, or masked groups of SDPA."""
    lens, heads, kv_heads, head_dim = [3, 20, 47, 90], 6, 2, 64
    k_cache, v_cache, tables = scattered_caches(lens, kv_heads, head_dim, dtype, seed=7)
    q = torch.randn(len(lens), heads, head_dim).to(dtype)
    k_new = torch.randn(len(lens), kv_heads, head_dim).to(dtype)
    v_new = torch.randn(len(lens), kv_heads, head_dim).to(dtype)
    last = torch.tensor(
        [int(tables[r, (n - 1) // BLOCK]) * BLOCK + (n - 1) % BLOCK for r, n in enumerate(lens)]
    )
    context = torch.tensor(lens)
    width = tables.shape[1] * BLOCK
    masks = (torch.arange(width) < context.unsqueeze(1)).view(len(lens), 1, 1, -1)

    def run(kernel, groups) -> torch.Tensor:
        metadata = AttentionMetadata(slot_mapping=last, num_decodes=len(lens), decode_groups=groups)
        attn = PagedAttention([(k_cache.clone(), v_cache.clone())], metadata, kernel)
        return attn.forward(0, q, k_new, v_new)

    fused = run(KERNEL, [DecodeGroup(0, len(lens), tables, context, None)])
    grouped = run(None, [DecodeGroup(0, 2, tables[:2], context[:2], masks[:2]),
                         DecodeGroup(2, 4, tables[2:], context[2:], masks[2:])])  # fmt: skip
    torch.testing.assert_close(fused.float(), grouped.float(), atol=TOLERANCE[dtype], rtol=0)


def dense_caches(dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (4, BLOCK, 2, 8)
    return [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))]


class _Spec:
    block_size = BLOCK


@pytest.mark.parametrize(
    ("dtype", "built", "uses_kernel"),
    [
        (torch.float32, True, True),
        (torch.bfloat16, True, True),
        (torch.float16, True, False),  # not a dtype the kernel is built for
        (torch.float32, False, False),  # no compiler (or HANZO_CPU_KERNELS=0)
    ],
)
def test_runner_uses_the_kernel_where_it_applies(monkeypatch, dtype, built, uses_kernel) -> None:
    monkeypatch.setattr(model_runner, "paged_decode_kernel", lambda: KERNEL if built else None)
    runner = ModelRunner(torch.nn.Identity(), _Spec(), dense_caches(dtype), torch.device("cpu"))
    assert (runner.decode_kernel is not None) is uses_kernel
    assert runner.decode_group_size == (None if uses_kernel else model_runner._CPU_DECODE_GROUP)
    strided = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in dense_caches(dtype)]  # not dense
    runner.set_kv_caches(strided)
    assert runner.decode_kernel is None


@pytest.mark.parametrize("lens", [[0, 5], [5, 2 * BLOCK + 1]])
def test_kernel_refuses_a_context_its_block_table_does_not_cover(lens: list[int]) -> None:
    k, v, tables = scattered_caches([5, 2 * BLOCK], 2, 16, torch.float32, seed=3)  # tables: 2 blocks wide
    with pytest.raises(RuntimeError, match=r"context_lens\[\d\] = \d+ is outside \[1, 32\]"):
        KERNEL(torch.randn(2, 4, 16), k, v, tables, torch.tensor(lens), 0.25)
