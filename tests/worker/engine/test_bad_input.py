"""Each bad input raises InvalidRequestError naming its field; nothing else in flight is affected."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.common.errors import InvalidArgument
from services.worker.engine import LLM, InvalidRequestError, LLMEngine, SamplingParams
from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.config import EngineConfig


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_bad_sampling_params(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:  # services/common/sampling.py: the gateway's check too
        SamplingParams(**kwargs)
    assert err.value.field == field
    assert field in str(err.value)


@pytest.fixture(scope="module")
def engine(llama_gqa_dir: Path) -> LLMEngine:
    return LLMEngine(llama_gqa_dir, EngineConfig(max_model_len=64))


@pytest.mark.parametrize(
    ("prompt", "field", "words"),
    [
        ("", "prompt", "empty"),
        ([], "prompt", "empty"),
        (list(range(3, 67)), "prompt", "64 tokens"),  # no room left to generate in a 64-token context
        ([5, 512], "prompt_token_ids", "outside the vocabulary"),
        ([5, -1], "prompt_token_ids", "outside the vocabulary"),
    ],
)
def test_bad_prompts(engine: LLMEngine, prompt: object, field: str, words: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("bad", prompt, SamplingParams())  # type: ignore[arg-type]
    assert err.value.field == field and words in str(err.value)
    assert not engine.has_unfinished_requests()


def test_duplicate_request_id(engine: LLMEngine) -> None:
    engine.add_request("dup", [5, 6, 7], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="already in flight"):
        engine.add_request("dup", [5, 6, 7], SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()


def test_mismatched_param_count(llama_gqa_dir: Path) -> None:
    llm = LLM(llama_gqa_dir)
    with pytest.raises(InvalidRequestError, match="2 SamplingParams for 3 prompts"):
        llm.generate([[5], [6], [7]], [SamplingParams(), SamplingParams()])


async def test_bad_request_does_not_disturb_others(llama_gqa_dir: Path) -> None:
    engine = LLMEngine(llama_gqa_dir)
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    prompt = list(range(10, 60))
    async with AsyncLLM(engine) as llm:

        async def good() -> list[int]:
            return [t async for out in llm.generate(prompt, greedy) for t in out.new_token_ids]

        task = asyncio.create_task(good())
        with pytest.raises(InvalidRequestError):
            async for _ in llm.generate([], greedy):
                pass
        with pytest.raises(InvalidRequestError):
            async for _ in llm.generate(list(range(5000)), greedy):
                pass
        streamed = await task
    assert streamed == LLM(llama_gqa_dir).generate([prompt], greedy)[0].token_ids
    assert engine.block_manager.num_used_blocks == 0
