"""The step log a serving engine writes (engine/step_log.py): every computed token accounted for, in the
shape the simulator's fit reads."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

from services.worker.engine import LLMEngine, SamplingParams
from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.config import EngineConfig
from services.worker.engine.embedding import EmbeddingEngine
from services.worker.engine.step_log import StepLog, StepShape, step_log_for

BUDGET = 64


def _lines(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_generation_steps_account_for_every_token(llama_gqa_dir: Path, tmp_path: Path) -> None:
    engine = LLMEngine(llama_gqa_dir, EngineConfig(max_num_batched_tokens=BUDGET))
    log_path = tmp_path / "steps.jsonl"
    outputs = 5
    params = SamplingParams(temperature=0.0, max_tokens=outputs, ignore_eos=True)
    # Distinct first tokens, so no block comes from the prefix cache: every prompt token is computed once.
    rng = random.Random(3)
    prompts = [[10 + i] + [rng.randrange(20, 500) for _ in range(n - 1)] for i, n in enumerate((100, 30, 7))]
    began = time.time()
    async with AsyncLLM(engine, StepLog(log_path)) as llm:

        async def run(name: str, prompt: list[int]) -> None:
            async for _ in llm.generate(prompt, params, request_id=name):
                pass

        await asyncio.gather(*(run(f"r{i}", p) for i, p in enumerate(prompts)))
    ended = time.time()
    lines = _lines(log_path)
    assert sum(line["prefill"] for line in lines) == sum(len(p) for p in prompts)
    # Each prompt's chunks, in the order they ran, cover it from its first token to its last.
    covered: dict[str, int] = {}
    for line in lines:
        assert sum(n for _, _, n in line["chunks"]) == line["prefill"]
        for request_id, start, n in line["chunks"]:
            assert start == covered.get(request_id, 0)
            covered[request_id] = start + n
    assert covered == {f"r{i}": len(p) for i, p in enumerate(prompts)}
    # Each request is noted once, when the engine took it, no later than the step that began its prompt.
    added = {request_id: when for line in lines for request_id, when in line["added"]}
    assert sorted(added) == sorted(covered)
    for line in lines:
        for request_id, start, _ in line["chunks"]:
            assert start > 0 or added[request_id] <= line["end"]
    # The first step found the requests taken so far queued, none yet holding a seat.
    assert lines[0]["running"] == 0 and lines[0]["waiting"] >= 1
    assert all(line["running"] + line["waiting"] <= 3 for line in lines)
    ends = [line["end"] for line in lines]
    assert began <= ends[0] and ends == sorted(ends) and ends[-1] <= ended
    # The prompt's last chunk samples the first token; each later token is one decode row whose context is
    # the tokens before it plus itself.
    assert sum(line["rows"] for line in lines) == len(prompts) * (outputs - 1)
    expected_context = sum(len(p) + k for p in prompts for k in range(1, outputs))
    assert sum(line["context"] for line in lines) == expected_context
    for line in lines:
        assert line["batches"] >= 1
        assert line["prefill"] + line["rows"] <= BUDGET * line["batches"]
        assert line["seconds"] >= line["execute_s"] > 0
        if line["prefill"] == 0:
            assert line["attention"] == 0
        else:
            assert line["attention"] >= line["prefill"]


def test_encoder_batches_are_logged(minilm_dir: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "encoder.jsonl"
    embedder = EmbeddingEngine(minilm_dir, step_log=StepLog(log_path))
    texts = ["a short one", "a somewhat longer sentence to embed"]
    tokens = sum(len(ids) for ids in embedder.tokenizer.encode_batch(texts))
    for text in texts:
        embedder.encode([text])
    embedder.close()
    lines = _lines(log_path)
    assert len(lines) == 2
    assert sum(line["prefill"] for line in lines) == tokens
    assert all(line["rows"] == 0 and line["batches"] == 1 and line["inputs"] == 1 for line in lines)
    assert lines[0]["end"] <= lines[1]["end"]


def test_no_directory_no_log(tmp_path: Path) -> None:
    assert step_log_for(None, "m", "worker-1") is None
    assert step_log_for("", "m", "worker-1") is None
    log = step_log_for(str(tmp_path / "logs"), "org/model:v1", "worker-7")
    assert log is not None and log.path == tmp_path / "logs" / "worker-7-org_model_v1.jsonl"
    log.close()


def test_attention_counts_a_first_chunk_causally_and_a_continued_one_whole(llama_gqa_dir: Path) -> None:
    # fifo: each step carries what the budget allows, so a 100-token prompt runs as 64 + 36 tokens. The
    # first chunk attends causally within itself (64 x 65 / 2 pairs); the second, through the cache's
    # mask, to all 100 keys (36 x 100): what the kernels compute, and what the simulator is fitted on.
    engine = LLMEngine(llama_gqa_dir, EngineConfig(max_num_batched_tokens=BUDGET, policy="fifo"))
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    prompt = [random.Random(5).randrange(20, 500) for _ in range(100)]
    engine.add_request("one", prompt, params, detokenize=False)
    shapes = []
    while engine.has_unfinished_requests():
        engine.step_shape = StepShape()
        engine.step()
        shapes.append((engine.step_shape.prefill, engine.step_shape.attention))
    assert shapes == [(64, 2080), (36, 3600)]
