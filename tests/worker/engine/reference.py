"""Reference outputs from transformers, the implementation our engine must match token for token."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch


@cache
def hf_model(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model_dir: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' generate(do_sample=False) continuation of one prompt (stops at EOS like ours)."""
    model = hf_model(model_dir)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
        )
    return out[0, len(prompt) :].tolist()


def mixed_prompts(count: int, vocab: int, seed: int, lengths: list[int] | None = None) -> list[list[int]]:
    """`count` random prompts whose lengths span 1 to 300+ tokens (ids >= 3 skip the special tokens)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = lengths or [1, 2, 5, 17, 31, 64, 100, 150, 200, 257, 301, 333, 12, 48, 90, 7][:count]
    lengths = (lengths * (count // len(lengths) + 1))[:count]
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]
