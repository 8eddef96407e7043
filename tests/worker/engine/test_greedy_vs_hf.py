"""Greedy outputs equal transformers' generate token for token, under chunked prefill, prefix caching
and preemption, with every KV block returned at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.worker.engine import LLM, SamplingParams
from tests.worker.engine.reference import hf_greedy, mixed_prompts

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


def assert_matches_hf(model_dir: Path, llm: LLM, prompts: list[list[int]]) -> None:
    outputs = llm.generate(prompts, GREEDY)
    eos = llm.engine.model_config.eos_token_ids
    for prompt, out in zip(prompts, outputs, strict=True):
        expected = hf_greedy(model_dir, prompt, MAX_TOKENS)
        assert out.token_ids == expected, f"prompt of {len(prompt)} tokens"
        assert out.finish_reason == ("stop" if expected[-1] in eos else "length")
    assert llm.engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize(
    "fixture", ["llama_gqa_dir", "llama_tied_dir", "qwen2_dir", "mistral_dir", "llama3_rope_dir"]
)
def test_mixed_batch_matches_transformers(fixture: str, request: pytest.FixtureRequest) -> None:
    model_dir = request.getfixturevalue(fixture)
    # A 64-token budget forces long prompts into chunks that share steps with other sequences' decodes.
    llm = LLM(model_dir, max_num_batched_tokens=64, max_num_seqs=16)
    prompts = mixed_prompts(16, vocab=512, seed=7)
    assert_matches_hf(model_dir, llm, prompts)
    assert llm.engine.stats.steps > 16  # many mixed steps, not one big one


def test_prefix_caching_hits_and_stays_exact(llama_gqa_dir: Path) -> None:
    llm = LLM(llama_gqa_dir, max_num_batched_tokens=128)
    shared = mixed_prompts(1, vocab=512, seed=11, lengths=[70])[0]
    tails = mixed_prompts(16, vocab=512, seed=12, lengths=[1, 5, 20, 40])
    prompts = [shared + tail for tail in tails]
    assert_matches_hf(llama_gqa_dir, llm, prompts)
    assert llm.engine.block_manager.prefix_hit_tokens > 0
    hits_before = llm.engine.block_manager.prefix_hit_tokens
    # A second identical round is served mostly from the cache and still gives the same tokens.
    outputs = llm.generate(prompts, GREEDY)
    assert llm.engine.block_manager.prefix_hit_tokens - hits_before >= 16 * 64
    assert all(o.num_cached_tokens >= 64 for o in outputs)
    assert_matches_hf(llama_gqa_dir, llm, prompts)


def test_preemption_under_a_tiny_kv_pool_stays_exact(llama_gqa_dir: Path) -> None:
    # 2 layers x 2 KV heads x 16 dims x 16 tokens x (K+V) x 4 bytes = 8 KiB a block: 48 blocks in all,
    # far less than 16 prompts of up to 333 tokens need at once.
    # fifo: the adaptive policy's admission leaves room for growth and would avoid preempting at all.
    llm = LLM(
        llama_gqa_dir,
        kv_cache_bytes=48 * 8192,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
        policy="fifo",
    )
    assert llm.engine.layout.num_kv_blocks == 48
    prompts = mixed_prompts(16, vocab=512, seed=7)
    assert_matches_hf(llama_gqa_dir, llm, prompts)
    assert llm.engine.stats.preemptions > 0


def test_preemption_with_prefix_caching(llama_gqa_dir: Path) -> None:
    llm = LLM(llama_gqa_dir, kv_cache_bytes=48 * 8192, max_num_batched_tokens=64, policy="fifo")
    shared = mixed_prompts(1, vocab=512, seed=21, lengths=[40])[0]
    prompts = [shared + tail for tail in mixed_prompts(16, vocab=512, seed=22, lengths=[3, 60, 150, 250])]
    assert_matches_hf(llama_gqa_dir, llm, prompts)
    assert llm.engine.stats.preemptions > 0
