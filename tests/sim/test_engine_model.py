"""The simulated engine against hand-computed step times, on a profile with round numbers."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import replace

import pytest

from services.common.workload import WorkloadClass
from sim.engine_model import GpuEngine
from sim.profiles import GpuProfile, ModelCost
from sim.request import Request

DECODER = ModelCost(
    name="m",
    base_s=0.010,
    per_row_s=0.001,
    per_context_token_s=0.0,  # no attention cost: decode steps are 10 ms + 1 ms per row
    per_prefill_token_s=0.0001,  # 1,000 prompt tokens: 100 ms
    per_prefill_attention_s=0.0,
    weight_bytes=10**9,
    kv_bytes_per_token=1000,
    load_s=1.0,
    reload_s=0.1,
)
ENCODER = ModelCost("e", 0.001, 0.0, 0.0, 0.00001, 0.0, 10**6, 0, 0.1, 0.01, embedding=True)
PROFILE = GpuProfile(
    name="test",
    memory_bytes=int(1.1e9 / 0.9),  # 0.9 x memory - weights = 0.1e9 - 1e6 bytes: ~99,000 KV tokens
    token_budget=2048,
    max_running=8,
    preempt_granularity_s=0.002,
    models={"m": DECODER, "e": ENCODER},
)


class Loop:
    """The simulation's event loop, reduced to what one engine needs."""

    def __init__(self, profile: GpuProfile = PROFILE) -> None:
        self.events: list[tuple[float, int, GpuEngine, int]] = []
        self.order = itertools.count()
        self.done: list[Request] = []
        self.engine = GpuEngine(0, profile, ["m", "e"], self.schedule, self.done.append)

    def schedule(self, when: float, engine: GpuEngine, version: int) -> None:
        heapq.heappush(self.events, (when, next(self.order), engine, version))

    def run_until(self, t_end: float) -> None:
        while self.events and self.events[0][0] <= t_end:
            when, _, engine, version = heapq.heappop(self.events)
            engine.on_event(when, version)


_ids = itertools.count(1)


def request(
    arrival: float,
    prompt: int,
    output: int,
    workload: WorkloadClass = WorkloadClass.REALTIME_CHAT,
    conversation: int = 0,
    model: str = "m",
) -> Request:
    return Request(next(_ids), workload, model, arrival, prompt, output, conversation, 0, 0, 0, "z")


def test_one_request_takes_its_prompt_step_then_one_decode_step_per_token() -> None:
    loop = Loop()
    r = request(0.0, prompt=1000, output=11)
    loop.engine.enqueue(r, 0.0)
    loop.run_until(10.0)
    assert r.first_token_s == pytest.approx(0.010 + 0.1)  # the model's base + 1,000 prompt tokens
    assert r.done_s == pytest.approx(r.first_token_s + 10 * 0.011)  # ten more tokens at 11 ms a step
    assert loop.done == [r] and loop.engine.kv_used == 0


def test_a_chat_prompt_arriving_mid_prompt_step_runs_nested() -> None:
    loop = Loop()
    doc = request(0.0, prompt=2000, output=2, workload=WorkloadClass.BATCH)
    loop.engine.enqueue(doc, 0.0)
    chat = request(0.05, prompt=100, output=2)
    loop.run_until(0.05)
    loop.engine.enqueue(chat, 0.05)
    loop.run_until(10.0)
    nested = 0.010 + 100 * 0.0001
    assert chat.first_token_s == pytest.approx(0.05 + PROFILE.preempt_granularity_s + nested)
    assert doc.first_token_s == pytest.approx(0.010 + 0.2 + nested)  # its step took the nested one longer


def test_waiting_prompts_go_in_class_order_when_seats_are_short() -> None:
    loop = Loop()
    running = [request(0.0, 10, 1000 + 10 * i, WorkloadClass.BATCH) for i in range(PROFILE.max_running)]
    for r in running:
        loop.engine.enqueue(r, 0.0)
    loop.run_until(0.5)
    late_batch = request(0.5, 10, 2, WorkloadClass.BATCH)
    chat = request(0.6, 10, 2)
    loop.engine.enqueue(late_batch, 0.5)
    loop.engine.enqueue(chat, 0.6)
    loop.run_until(100.0)
    first_free = min(r.done_s for r in running)
    assert first_free < chat.first_token_s < late_batch.first_token_s  # the first free seat: chat's


def test_a_follow_up_turn_on_the_same_gpu_computes_only_its_new_tokens() -> None:
    loop = Loop()
    first = request(0.0, prompt=1000, output=100, conversation=7)
    loop.engine.enqueue(first, 0.0)
    loop.run_until(10.0)
    second = request(20.0, prompt=1200, output=2, conversation=7)  # the history (1,100) and 100 new
    loop.engine.enqueue(second, 20.0)
    loop.run_until(30.0)
    assert second.cached == 1100 and loop.engine.prefix_hits == 1
    assert second.first_token_s - 20.0 == pytest.approx(0.010 + 100 * 0.0001)


def test_a_prompt_without_kv_room_waits_for_a_sequence_to_finish() -> None:
    loop = Loop()
    capacity = loop.engine.kv_capacity
    big = request(0.0, prompt=capacity // 2, output=capacity // 2 - 10, workload=WorkloadClass.BATCH)
    loop.engine.enqueue(big, 0.0)
    loop.run_until(0.001)
    small = request(0.001, prompt=100, output=20, workload=WorkloadClass.BATCH)
    loop.engine.enqueue(small, 0.001)
    loop.run_until(10_000.0)
    assert small.first_token_s > big.done_s


def test_an_embedding_runs_at_once_beside_the_decodes() -> None:
    loop = Loop()
    r = request(0.0, prompt=100, output=50)
    loop.engine.enqueue(r, 0.0)
    loop.run_until(0.2)
    e = request(0.2, prompt=100, output=0, workload=WorkloadClass.EMBEDDING, model="e")
    loop.engine.enqueue(e, 0.2)
    assert e.done_s == pytest.approx(0.2 + PROFILE.preempt_granularity_s + 0.001 + 100 * 0.00001)
    loop.run_until(10.0)
    assert r.done_s > 0 and e in loop.done


def test_with_known_layers_a_chat_prompt_waits_half_a_layer_of_the_running_step() -> None:
    loop = Loop(replace(PROFILE, layers=10))
    doc = request(0.0, prompt=2000, output=2, workload=WorkloadClass.BATCH)
    loop.engine.enqueue(doc, 0.0)
    loop.run_until(0.05)
    chat = request(0.05, prompt=100, output=2)
    loop.engine.enqueue(chat, 0.05)
    loop.run_until(10.0)
    step = 0.010 + 0.2  # the document's prompt step, running when the chat arrives
    assert chat.first_token_s == pytest.approx(0.05 + step / 20 + 0.010 + 100 * 0.0001)


def test_with_known_layers_a_prompt_arriving_mid_decode_waits_half_a_layer_of_the_decode_step() -> None:
    loop = Loop(replace(PROFILE, layers=10, preempt_granularity_s=1.0))
    long = request(0.0, prompt=100, output=400, workload=WorkloadClass.BATCH)
    loop.engine.enqueue(long, 0.0)
    loop.run_until(0.0205)  # inside its first decode step: 10 ms base + 1 ms for its row
    chat = request(0.0205, prompt=100, output=2)
    loop.engine.enqueue(chat, 0.0205)
    loop.run_until(10.0)
    decode_step = 0.011
    assert chat.first_token_s == pytest.approx(0.0205 + decode_step / 20 + 0.010 + 0.001 + 100 * 0.0001)


def test_an_encoder_without_a_wait_runs_the_moment_it_arrives() -> None:
    loop = Loop(replace(PROFILE, encoder_wait_s=0.0))
    r = request(0.0, prompt=100, output=50)
    loop.engine.enqueue(r, 0.0)
    loop.run_until(0.2)
    e = request(0.2, prompt=100, output=0, workload=WorkloadClass.EMBEDDING, model="e")
    loop.engine.enqueue(e, 0.2)
    assert e.done_s == pytest.approx(0.2 + 0.001 + 100 * 0.00001)


@pytest.mark.parametrize(
    ("share", "chunks"),
    [
        (None, 1),  # no adaptive budget: the whole prompt in one step
        # (b + 1) / (11 ms + 0.1 ms x b) >= 0.9 x the best (b = 2,047): b = 640, so four chunks
        (0.9, 4),
    ],
)
def test_beside_a_chat_decode_the_adaptive_budget_cuts_a_document_into_chunks(
    share: float | None, chunks: int
) -> None:
    loop = Loop(replace(PROFILE, itl_min_efficiency=share))
    chat = request(0.0, prompt=100, output=50)
    loop.engine.enqueue(chat, 0.0)
    loop.run_until(0.05)
    doc = request(0.05, prompt=2000, output=2, workload=WorkloadClass.BATCH)
    loop.engine.enqueue(doc, 0.05)
    loop.run_until(10.0)
    decode_ends = 0.02 + 3 * 0.011  # the chat's prompt step, then its third decode step ends after 0.05
    assert doc.first_token_s == pytest.approx(decode_ends + chunks * 0.011 + 2000 * 0.0001)


def test_with_only_throughput_work_the_adaptive_budget_takes_the_best_rate() -> None:
    loop = Loop(replace(PROFILE, itl_min_efficiency=0.9))
    doc = request(0.0, prompt=2000, output=2, workload=WorkloadClass.BATCH)
    loop.engine.enqueue(doc, 0.0)
    loop.run_until(10.0)
    assert doc.first_token_s == pytest.approx(0.010 + 2000 * 0.0001)  # no fixed cost paid twice


def test_batch_running_counts_admitted_batch_requests_until_they_finish() -> None:
    """What the feed reports as batch_running (waiting batch is len(waiting[2])): chat never counts."""
    loop = Loop()
    docs = [request(0.0, 100, 3, WorkloadClass.BATCH) for _ in range(2)]
    chat = request(0.0, 100, 3)
    for r in [*docs, chat]:
        loop.engine.enqueue(r, 0.0)
    assert loop.engine.batch_running == 0  # queued, not admitted
    loop.run_until(0.0)
    assert loop.engine.batch_running == 2
    loop.run_until(100.0)
    assert loop.engine.batch_running == 0 and len(loop.done) == 3
