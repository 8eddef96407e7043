"""Sampling controls end to end through the engine: seeds, top-k/top-p, stops, max_tokens, ignore_eos."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from services.worker.engine import LLM, SamplingParams
from tests.worker.engine.reference import mixed_prompts


@pytest.fixture(scope="module")
def llm(llama_gqa_dir: Path) -> LLM:
    return LLM(llama_gqa_dir, max_num_batched_tokens=128)


def test_same_seed_same_output_whatever_the_batch(llm: LLM) -> None:
    prompt = mixed_prompts(1, 512, seed=3, lengths=[20])[0]
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=24, ignore_eos=True)
    alone = llm.generate([prompt], seeded)[0].token_ids
    others = mixed_prompts(6, 512, seed=4)
    crowd = llm.generate([*others, prompt], [SamplingParams(temperature=1.0, max_tokens=24)] * 6 + [seeded])
    assert crowd[-1].token_ids == alone
    other_seed = llm.generate([prompt], dataclasses.replace(seeded, seed=4321))[0].token_ids
    assert other_seed != alone


def test_sampling_is_not_greedy_and_truncation_collapses_to_greedy(llm: LLM) -> None:
    prompt = mixed_prompts(1, 512, seed=5, lengths=[30])[0]
    greedy = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))[0]
    hot = llm.generate([prompt], SamplingParams(temperature=5.0, seed=7, max_tokens=16, ignore_eos=True))[0]
    assert hot.token_ids != greedy.token_ids
    for params in (
        SamplingParams(temperature=1.0, top_k=1, seed=1, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=1e-6, seed=2, max_tokens=16, ignore_eos=True),
    ):
        assert llm.generate([prompt], params)[0].token_ids == greedy.token_ids


def test_top_k_limits_choices(llm: LLM) -> None:
    prompt = mixed_prompts(1, 512, seed=6, lengths=[10])[0]
    draws = {
        tuple(
            llm.generate([prompt], SamplingParams(temperature=3.0, top_k=2, seed=s, max_tokens=1))[
                0
            ].token_ids
        )
        for s in range(40)
    }
    assert len(draws) == 2  # both of the two most likely tokens, and nothing else


def test_stop_string_ends_output_and_is_not_returned(llm: LLM, llama_gqa_dir: Path) -> None:
    prompt = "The quick brown fox"
    free = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))[0]
    assert len(free.text) > 12
    stop = free.text[6:9]
    first = free.text.find(stop)
    stopped = llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop])
    )
    assert stopped[0].finish_reason == "stop" and stopped[0].stop_reason == stop
    assert free.stop_reason is None
    assert stopped[0].text == free.text[:first]
    assert len(stopped[0].token_ids) < len(free.token_ids)


def test_stop_token_ids_and_max_tokens(llm: LLM) -> None:
    prompt = mixed_prompts(1, 512, seed=8, lengths=[25])[0]
    free = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop_id = free.token_ids[4]
    cut = free.token_ids.index(stop_id) + 1
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_id]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    assert free.stop_reason is None  # a length cut names nothing
    assert out.token_ids == free.token_ids[:cut]


def test_eos_stops_unless_ignored(llm: LLM) -> None:
    prompt = mixed_prompts(1, 512, seed=9, lengths=[15])[0]
    engine = llm.engine
    first = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[
        0
    ].token_ids
    original = engine.model_config
    # Make the model's first greedy token its EOS, as if the checkpoint said so.
    engine.model_config = dataclasses.replace(original, eos_token_ids=frozenset({first[0]}))
    try:
        stops = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6))[0]
        ignores = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    finally:
        engine.model_config = original
    assert stops.token_ids == first[:1] and stops.finish_reason == "stop"
    assert stops.stop_reason is None  # an EOS id is not a stop_reason, as in vLLM
    assert ignores.token_ids == first and ignores.finish_reason == "length"


def test_context_limit_finishes_with_length(llama_gqa_dir: Path) -> None:
    llm = LLM(llama_gqa_dir, max_model_len=40)
    out = llm.generate(
        [list(range(3, 33))], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    )[0]
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 40 - 30
