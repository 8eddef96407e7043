"""The adaptive policy on a real (tiny) model: a realtime request gets in within one step under a
running batch load, and preempting batch requests for it leaves their greedy outputs unchanged."""

from __future__ import annotations

from pathlib import Path

from services.common.sampling import SamplingParams
from services.common.workload import WorkloadClass
from services.worker.engine.config import EngineConfig
from services.worker.engine.llm_engine import LLMEngine
from services.worker.engine.policy.classes import SchedulingHints
from tests.worker.engine.reference import mixed_prompts

BATCH = SchedulingHints(workload=WorkloadClass.BATCH, tenant="docs")
CHAT = SchedulingHints(workload=WorkloadClass.REALTIME_CHAT, tenant="app")
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def engine(model_dir: Path) -> LLMEngine:
    # Four seats, so a batch load fills every seat and the chat request must displace one.
    return LLMEngine(model_dir, EngineConfig(max_num_seqs=4, max_num_batched_tokens=128))


def run_to_end(eng: LLMEngine, tokens: dict[str, list[int]]) -> int:
    steps = 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        steps += 1
        assert steps < 500
    return steps


def test_realtime_request_is_admitted_within_one_step_under_batch_load(llama_gqa_dir: Path) -> None:
    documents = mixed_prompts(6, vocab=512, seed=31, lengths=[150, 200, 250])
    alone = engine(llama_gqa_dir)
    expected: dict[str, list[int]] = {}
    for i, prompt in enumerate(documents):
        alone.add_request(f"doc-{i}", prompt, GREEDY, detokenize=False, hints=BATCH)
    run_to_end(alone, expected)
    assert alone.stats.preemptions == 0

    loaded = engine(llama_gqa_dir)
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(documents):
        loaded.add_request(f"doc-{i}", prompt, GREEDY, detokenize=False, hints=BATCH)
    for _ in range(10):  # until every seat is taken by a batch document
        for out in loaded.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if loaded.scheduler.num_running == 4:
            break
    assert loaded.scheduler.num_running == 4 and loaded.scheduler.num_waiting == 2
    chat_prompt = mixed_prompts(1, vocab=512, seed=32, lengths=[20])[0]
    loaded.add_request("chat", chat_prompt, GREEDY, detokenize=False, hints=CHAT)

    first = loaded.step()
    chat_out = [o for o in first if o.request_id == "chat"]
    assert chat_out and chat_out[0].new_token_ids, "the chat request got its first token in one step"
    assert loaded.stats.preemptions_by_class[WorkloadClass.BATCH] >= 1
    for out in first:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    run_to_end(loaded, tokens)

    assert len(tokens["chat"]) == GREEDY.max_tokens
    # Preempted documents recomputed from their prefix and produced exactly what they produce alone.
    assert {rid: t for rid, t in tokens.items() if rid != "chat"} == expected
    assert loaded.block_manager.num_used_blocks == 0


def test_chat_output_is_the_same_under_load_as_alone(llama_gqa_dir: Path) -> None:
    chat_prompt = mixed_prompts(1, vocab=512, seed=33, lengths=[40])[0]
    alone = engine(llama_gqa_dir)
    alone.add_request("chat", chat_prompt, GREEDY, detokenize=False, hints=CHAT)
    expected: dict[str, list[int]] = {}
    run_to_end(alone, expected)

    loaded = engine(llama_gqa_dir)
    for i, prompt in enumerate(mixed_prompts(8, vocab=512, seed=34, lengths=[100, 300])):
        loaded.add_request(f"doc-{i}", prompt, GREEDY, detokenize=False, hints=BATCH)
    loaded.step()
    loaded.add_request("chat", chat_prompt, GREEDY, detokenize=False, hints=CHAT)
    tokens: dict[str, list[int]] = {}
    run_to_end(loaded, tokens)
    assert tokens["chat"] == expected["chat"]
