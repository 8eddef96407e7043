"""The decoder is a plain nn.Module: with no preemption points its decode forward compiles whole with
torch.compile (Inductor, no graph breaks) and computes what the eager module does, the precondition for
compiling or CUDA-graph capturing the decode step later."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from services.worker.models.loader import load_model
from services.worker.models.paged_attention import (
    AttentionMetadata,
    DecodeGroup,
    PagedAttention,
    PrefillChunk,
)

BLOCK = 16
PROMPTS = [[1, 5, 9, 2, 7], [3, 4], [8, 6, 2, 2, 9, 11, 4, 3, 1]]  # sequence i owns cache block i
DECODE_STEPS = 4  # every context stays inside its first block, so the shapes never change


def _caches(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    c = model.config
    shape = (len(PROMPTS), BLOCK, c.num_key_value_heads, c.head_dim)
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(c.num_hidden_layers)]


def _prefill(model: nn.Module, caches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    """Every prompt in one eager step; the greedy next token of each."""
    ids, positions, slots, chunks = [], [], [], []
    for seq, prompt in enumerate(PROMPTS):
        chunks.append(PrefillChunk(len(ids), len(prompt), None, len(prompt), None))
        ids += prompt
        positions += range(len(prompt))
        slots += [seq * BLOCK + p for p in range(len(prompt))]
    metadata = AttentionMetadata(slot_mapping=torch.tensor(slots), num_decodes=0, prefills=chunks)
    hidden = model(torch.tensor(ids), torch.tensor(positions), PagedAttention(caches, metadata))
    last_rows = torch.tensor([c.start + c.num_tokens - 1 for c in chunks])
    return model.compute_logits(hidden[last_rows]).argmax(-1).tolist()


def _decode_metadata(context_lens: list[int]) -> AttentionMetadata:
    lens = torch.tensor(context_lens)
    tables = torch.arange(len(context_lens)).unsqueeze(1)  # [g, 1]: one block each
    mask = (torch.arange(BLOCK) < lens.unsqueeze(1)).view(len(context_lens), 1, 1, BLOCK)
    group = DecodeGroup(0, len(context_lens), tables, lens, mask)
    slots = torch.tensor([seq * BLOCK + n - 1 for seq, n in enumerate(context_lens)])
    return AttentionMetadata(slot_mapping=slots, num_decodes=len(context_lens), decode_groups=[group])


def _decode(forward, model: nn.Module, caches, first_tokens: list[int]) -> list[torch.Tensor]:
    """DECODE_STEPS greedy decode steps of every sequence through forward; each step's logits."""
    tokens = first_tokens
    lens = [len(p) for p in PROMPTS]
    logits = []
    for _ in range(DECODE_STEPS):
        lens = [n + 1 for n in lens]
        positions = torch.tensor([n - 1 for n in lens])
        attn = PagedAttention(caches, _decode_metadata(lens))  # no preemption points
        step_logits = model.compute_logits(forward(torch.tensor(tokens), positions, attn))
        logits.append(step_logits)
        tokens = step_logits.argmax(-1).tolist()
    return logits


def test_the_decode_forward_compiles_whole_and_matches_eager(llama_gqa_dir: Path) -> None:
    model = load_model(llama_gqa_dir, torch.float32, torch.device("cpu")).model
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False)  # fullgraph: a graph break fails
    try:
        with torch.inference_mode():
            eager_caches, compiled_caches = _caches(model), _caches(model)
            first = _prefill(model, eager_caches)
            assert _prefill(model, compiled_caches) == first
            eager = _decode(model, model, eager_caches, first)
            got = _decode(compiled, model, compiled_caches, first)
    finally:
        torch._dynamo.reset()
    for step_eager, step_compiled in zip(eager, got, strict=True):
        torch.testing.assert_close(step_compiled, step_eager, rtol=1e-4, atol=1e-4)
        assert torch.equal(step_compiled.argmax(-1), step_eager.argmax(-1))
    for (k_eager, v_eager), (k_got, v_got) in zip(eager_caches, compiled_caches, strict=True):
        torch.testing.assert_close(k_got, k_eager, rtol=1e-4, atol=1e-5)  # the compiled step wrote its K/V
        torch.testing.assert_close(v_got, v_eager, rtol=1e-4, atol=1e-5)
