"""Streaming through the engine thread: deltas, concurrency, abort and cancellation free KV at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from services.common.workload import WorkloadClass
from services.worker.engine import LLM, LLMEngine, SamplingParams
from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.config import EngineConfig
from services.worker.engine.errors import AdmissionError
from services.worker.engine.policy.classes import PolicyConfig, SchedulingHints
from tests.worker.engine.reference import mixed_prompts
from tests.worker.engine.test_policy_scheduler import classes_with

LONG = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)


@pytest.fixture
def engine(llama_gqa_dir: Path) -> LLMEngine:
    return LLMEngine(llama_gqa_dir, EngineConfig(max_num_batched_tokens=64))


async def test_streams_equal_offline_output(engine: LLMEngine, llama_gqa_dir: Path) -> None:
    prompts = ["Once upon a time", "The quick brown fox jumps", *mixed_prompts(6, 512, seed=31)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    async with AsyncLLM(engine) as llm:

        async def collect(prompt: str | list[int]) -> tuple[list[int], str, str | None]:
            ids, text, reason = [], "", None
            async for out in llm.generate(prompt, params):
                ids += out.new_token_ids
                text += out.new_text
                reason = out.finish_reason
            return ids, text, reason

        streamed = await asyncio.gather(*(collect(p) for p in prompts))
    offline = LLM(llama_gqa_dir).generate(prompts, params)
    for (ids, text, reason), ref in zip(streamed, offline, strict=True):
        assert ids == ref.token_ids
        assert text == ref.text
        assert reason == "length"


async def test_cancelled_client_frees_kv_at_once(engine: LLMEngine) -> None:
    async with AsyncLLM(engine) as llm:
        first_token = asyncio.Event()

        async def consume() -> None:
            async for _ in llm.generate(list(range(5, 205)), LONG):
                first_token.set()

        task = asyncio.create_task(consume())
        await first_token.wait()
        assert engine.block_manager.num_used_blocks > 0
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.wait_for(llm.wait_idle(), timeout=30)
        assert engine.block_manager.num_used_blocks == 0
        assert engine.stats.generated_tokens < LONG.max_tokens


async def test_abort_ends_stream_with_abort_reason(engine: LLMEngine) -> None:
    async with AsyncLLM(engine) as llm:
        reasons = []
        aborted = False
        async for out in llm.generate(list(range(5, 50)), LONG, request_id="to-abort"):
            if out.num_output_tokens >= 3 and not aborted:
                llm.abort("to-abort")
                aborted = True
            reasons.append(out.finish_reason)
        assert reasons[-1] == "abort"
        await asyncio.wait_for(llm.wait_idle(), timeout=30)
    assert engine.block_manager.num_used_blocks == 0


async def test_breaking_out_of_a_stream_aborts(engine: LLMEngine) -> None:
    async with AsyncLLM(engine) as llm:
        async with contextlib.aclosing(llm.generate(list(range(5, 50)), LONG)) as stream:
            async for out in stream:
                if out.num_output_tokens >= 2:
                    break
        await asyncio.wait_for(llm.wait_idle(), timeout=30)
    assert engine.block_manager.num_used_blocks == 0
    assert not engine.has_unfinished_requests()


async def test_a_busy_consumer_gets_coalesced_outputs(engine: LLMEngine, llama_gqa_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    prompt = list(range(5, 40))
    async with AsyncLLM(engine) as llm:
        outputs = []
        async for out in llm.generate(prompt, params):
            outputs.append(out)
            time.sleep(0.02)  # a busy process: the engine runs ahead of this consumer
    tokens = [t for out in outputs for t in out.new_token_ids]
    assert tokens == LLM(llama_gqa_dir).generate([prompt], params)[0].token_ids
    assert len(outputs) < len(tokens)  # several tokens per output once it fell behind
    assert outputs[-1].finished and outputs[-1].num_output_tokens == 60


async def test_refusals_reach_the_caller_with_a_retry_hint(llama_gqa_dir: Path) -> None:
    classes = classes_with(WorkloadClass.BATCH, max_waiting=1, queue_timeout_s=0.2)
    config = EngineConfig(max_num_seqs=1, policy=PolicyConfig(classes=classes))
    batch = SchedulingHints(workload=WorkloadClass.BATCH)
    async with AsyncLLM(LLMEngine(llama_gqa_dir, config)) as llm:
        holder = llm.generate([5, 6, 7], LONG, hints=batch)
        first = await anext(holder)  # holds the only seat for 400 tokens
        assert first.new_token_ids
        queued = llm.generate([8, 9], LONG, hints=batch)
        started = time.monotonic()
        with pytest.raises(AdmissionError, match="queue timeout") as timed_out:
            await anext(queued)
        assert time.monotonic() - started < 5.0 and timed_out.value.retry_after_s > 0
        again = llm.generate([8, 9], LONG, hints=batch)
        waiting = asyncio.ensure_future(anext(again))
        for _ in range(1000):  # until the engine thread has queued it (bounded; no fixed sleep)
            if llm.engine.scheduler.num_waiting == 1:
                break
            await asyncio.sleep(0.001)
        full = llm.generate([10, 11], LONG, hints=batch)
        with pytest.raises(AdmissionError, match="queue is full"):
            await anext(full)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError, AdmissionError):
            await waiting
        await holder.aclose()
        await llm.wait_idle()
        assert llm.engine.block_manager.num_used_blocks == 0
