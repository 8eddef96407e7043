"""n choices of one prompt through the engine thread: each choice its own seeded stream, the prompt's
full blocks computed once (the later choices find them in the prefix cache), a refusal raised before
any choice runs, and a caller leaving early aborting every choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.worker.engine import LLM, LLMEngine, SamplingParams
from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.choices import generate_choices
from services.worker.engine.config import EngineConfig
from services.worker.engine.errors import InvalidRequestError
from services.worker.engine.outputs import RequestOutput
from tests.worker.engine.reference import mixed_prompts

PROMPT = mixed_prompts(1, 512, seed=41, lengths=[75])[0]  # four full blocks of 16 and 11 tokens more
SAMPLED = SamplingParams(temperature=1.0, seed=11, max_tokens=10, ignore_eos=True, n=3)


@pytest.fixture
def engine(llama_gqa_dir: Path) -> LLMEngine:
    return LLMEngine(llama_gqa_dir, EngineConfig(max_num_batched_tokens=64))


async def _choices(llm: AsyncLLM, params: SamplingParams, request_id: str) -> dict[int, list[RequestOutput]]:
    by_choice: dict[int, list[RequestOutput]] = {}
    async for index, out in generate_choices(llm, PROMPT, params, request_id):
        by_choice.setdefault(index, []).append(out)
    return by_choice


async def test_each_choice_samples_with_its_own_seed_and_reuses_the_prompt(
    engine: LLMEngine, llama_gqa_dir: Path
) -> None:
    async with AsyncLLM(engine) as llm:
        by_choice = await _choices(llm, SAMPLED, "r")
    assert sorted(by_choice) == [0, 1, 2]
    tokens = {i: [t for out in outs for t in out.new_token_ids] for i, outs in by_choice.items()}
    # Choice i is the request with seed + i alone (what the offline engine samples for it).
    alone = LLM(llama_gqa_dir).generate([PROMPT] * 3, [SAMPLED.choice(i) for i in range(3)])
    assert tokens == {i: out.token_ids for i, out in enumerate(alone)}
    assert len({tuple(t) for t in tokens.values()}) == 3  # three seeds, three different outputs
    finals = {i: outs[-1] for i, outs in by_choice.items()}
    assert all(f.finished and f.num_output_tokens == 10 for f in finals.values())
    full_blocks = len(PROMPT) // 16 * 16
    assert [finals[i].num_cached_tokens for i in range(3)] == [0, full_blocks, full_blocks]
    assert not engine.has_unfinished_requests()


async def test_a_refused_request_raises_before_any_choice_is_added(engine: LLMEngine) -> None:
    async with AsyncLLM(engine) as llm:
        with pytest.raises(InvalidRequestError, match="logit_bias"):
            await _choices(llm, SamplingParams(n=4, logit_bias={10**6: 1.0}), "bad")
        assert llm.num_in_flight == 0


async def test_leaving_early_aborts_every_choice(engine: LLMEngine) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True, n=3)
    async with AsyncLLM(engine) as llm:
        seen: set[int] = set()
        stream = generate_choices(llm, PROMPT, long, "early")
        async for index, _ in stream:
            seen.add(index)
            if len(seen) == 3:
                break
        await stream.aclose()
        await llm.wait_idle()
    assert engine.block_manager.num_used_blocks == 0


def test_the_engine_itself_refuses_several_choices(engine: LLMEngine) -> None:
    with pytest.raises(InvalidRequestError, match="one choice per request"):
        engine.add_request("r", PROMPT, SamplingParams(n=2))


async def test_leaving_at_the_first_output_aborts_the_first_choice(engine: LLMEngine) -> None:
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True, n=3)
    async with AsyncLLM(engine) as llm:
        stream = generate_choices(llm, PROMPT, long, "first-only")
        index, _ = await anext(stream)
        await stream.aclose()
        assert index == 0 and llm.num_in_flight == 0  # before the others were added: only the first ran
        await llm.wait_idle()
    assert engine.block_manager.num_used_blocks == 0
