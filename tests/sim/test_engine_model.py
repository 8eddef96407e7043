"""The simulated engine against hand-computed step times, on a profile with round numbers."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import replace

import pytest

from services.common.workload import WorkloadClass
from sim.engine_model import GpuEngine
from sim.prefix_cache import usable_hit
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

    def __init__(self, profile: GpuProfile = PROFILE, refusing: bool = False) -> None:
        """refusing: the engine refuses prompts past their queue timeout into self.refused, with the time."""
        self.events: list[tuple[float, int, GpuEngine, int]] = []
        self.order = itertools.count()
        self.done: list[Request] = []
        self.refused: list[tuple[Request, float]] = []
        on_refused = (lambda r: self.refused.append((r, self.engine.t))) if refusing else None
        self.engine = GpuEngine(0, profile, ["m", "e"], self.schedule, self.done.append, (), on_refused)

    def schedule(self, when: float, engine: GpuEngine, version: int) -> None:
        heapq.heappush(self.events, (when, next(self.order), engine, version))

    def run_until(self, t_end: float) -> None:
        while self.events and self.events[0][0] <= t_end:
            self.next()

    def run_to_preemption(self) -> None:
        """Run events until the engine has preempted a sequence."""
        while self.engine.preemptions == 0 and self.events:
            self.next()

    def next(self) -> None:
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
    return Request(next(_ids), workload, model, arrival, prompt, output, conversation, 0, 0, (), "z")


def test_one_request_takes_its_prompt_step_then_one_decode_step_per_token() -> None:
    loop = Loop()
    r = request(0.0, prompt=1000, output=11)
    loop.engine.enqueue(r, 0.0)
    loop.run_until(10.0)
    assert r.first_token_s == pytest.approx(0.010 + 0.1)  # the model's base + 1,000 prompt tokens
    assert r.done_s == pytest.approx(r.first_token_s + 10 * 0.011)  # ten more tokens at 11 ms a step
    assert loop.done == [r] and loop.engine.kv_used == 0


@pytest.mark.parametrize(
    ("running", "nests"),
    [(WorkloadClass.BATCH, True), (WorkloadClass.AGENT_TOOL, True), (WorkloadClass.REALTIME_CHAT, False)],
)
def test_a_chat_prompt_arriving_mid_prompt_step_runs_nested_unless_it_outranks_nothing_there(
    running: WorkloadClass, nests: bool
) -> None:
    """A chat prompt arriving during a prompt step runs nested in it, and the step ends that much later;
    but a step computing latency-class prompts is the worker's urgent step, which only a prompt that
    outranks all of them interrupts: a chat prompt waits for another chat prompt's step to end."""
    loop = Loop()
    first = request(0.0, prompt=2000, output=2, workload=running)
    loop.engine.enqueue(first, 0.0)
    chat = request(0.05, prompt=100, output=2)
    loop.run_until(0.05)
    loop.engine.enqueue(chat, 0.05)
    loop.run_until(10.0)
    own_step = 0.010 + 100 * 0.0001
    first_step_end = 0.010 + 0.2
    if nests:
        assert chat.first_token_s == pytest.approx(0.05 + PROFILE.preempt_granularity_s + own_step)
        # The interrupted step took the nested one longer.
        assert first.first_token_s == pytest.approx(first_step_end + own_step)
    else:
        assert first.first_token_s == pytest.approx(first_step_end)  # not held up by the later chat
        assert chat.first_token_s > first_step_end


def test_a_chat_prompt_finding_every_seat_taken_displaces_the_latest_batch_admission() -> None:
    loop = Loop()
    running = [
        request(0.0, 10, 1000 + 10 * i, WorkloadClass.BATCH, conversation=100 + i)
        for i in range(PROFILE.max_running)
    ]
    for r in running:
        loop.engine.enqueue(r, 0.0)
    loop.run_until(0.5)
    late_batch = request(0.5, 10, 2, WorkloadClass.BATCH)
    chat = request(0.6, 10, 2)
    loop.engine.enqueue(late_batch, 0.5)  # no seat, and it outranks nothing: it waits
    loop.engine.enqueue(chat, 0.6)
    loop.run_to_preemption()
    victim = running[-1]  # the worst ranked: batch, admitted last
    assert victim.preemptions == 1 and victim in loop.engine.waiting[2]
    streamed = victim.generated
    assert 0 < streamed < victim.output
    loop.run_until(1000.0)
    assert sum(r.preemptions for r in running) == 1 and loop.engine.preemptions == 1
    first_free = min(r.done_s for r in running[:-1])
    assert chat.done_s < first_free  # it did not wait for a seat
    # The victim went back to the head of the batch queue: it is admitted again before the late one, its
    # first token time is kept, and its recompute hit its own blocks, still cached: only what lies past
    # its last whole block is computed again (a partly filled block is never cached, and the last token
    # it streamed was never written to KV).
    assert victim.admit_no < late_batch.admit_no
    assert victim.first_token_s < 0.5 and victim.done_s > 0 and victim.generated == victim.output
    tokens = 10 + streamed
    assert loop.engine.recomputed_tokens == tokens - usable_hit(tokens - 1, tokens, PROFILE.block_tokens)
    assert 1 <= loop.engine.recomputed_tokens <= PROFILE.block_tokens
    assert victim.cached == 0  # cached: its prompt's, at first
    assert loop.engine.kv_used == pytest.approx(0.0) and loop.engine.kv_prompts == 0


def test_a_chat_prompt_arriving_mid_step_runs_nested_only_in_a_free_seat() -> None:
    """Nothing running is displaced while a step executes: with every seat taken the chat prompt waits
    for the step's end, then takes the latest batch admission's seat."""
    loop = Loop()
    docs = [request(0.0, 100, 50, WorkloadClass.BATCH) for _ in range(PROFILE.max_running)]
    for r in docs:
        loop.engine.enqueue(r, 0.0)
    loop.run_until(0.0)
    step_end = loop.engine.step_end  # the eight prompts in one step, every seat taken
    assert step_end == pytest.approx(0.010 + 800 * 0.0001) and loop.engine.num_running == 8
    chat = request(0.01, 100, 2)
    loop.engine.enqueue(chat, 0.01)
    loop.run_until(100.0)
    assert chat.first_token_s > step_end
    assert docs[-1].preemptions == 1 and loop.engine.preemptions == 1


_WEIGHTS = DECODER.weight_bytes + ENCODER.weight_bytes
SMALL_POOL = replace(PROFILE, memory_bytes=int((_WEIGHTS + 10_000_000) / 0.9))  # ~10,000 KV tokens


@pytest.mark.parametrize(
    ("workload", "output", "share", "extra", "admitted"),
    [
        (WorkloadClass.BATCH, 1000, 0.11, 0, True),  # watermark 1% + latency reserve 10%
        (WorkloadClass.BATCH, 1000, 0.11, 1, False),
        (WorkloadClass.REALTIME_CHAT, 1000, 0.01, 0, True),  # the reserve is the latency classes'
        (WorkloadClass.REALTIME_CHAT, 1000, 0.01, 1, False),
        (WorkloadClass.AGENT_TOOL, 10, 0.01, 54, True),  # a 10-token output needs room for 10, not 64
    ],
)
def test_admission_needs_room_for_the_prompt_its_expected_output_and_the_reserves(
    workload: WorkloadClass, output: int, share: float, extra: int, admitted: bool
) -> None:
    """scheduler.py's rule: prompt + min(output, expected_output_tokens) + the watermark's share of the
    pool, and for batch also the latency reserve's share, must be free."""
    loop = Loop(replace(PROFILE, token_budget=200_000))  # every prompt in one step
    capacity = loop.engine.kv_capacity
    first = request(0.0, prompt=50_000, output=1000)  # chat: admitted first, whatever comes second
    fits = math.floor(capacity - 50_000 - 64 - share * capacity)
    second = request(0.0, prompt=fits + extra, output=output, workload=workload)
    loop.engine.enqueue(first, 0.0)
    loop.engine.enqueue(second, 0.0)
    loop.run_until(0.0)
    assert first.admit_no > 0 and (second.admit_no > 0) == admitted and loop.engine.preemptions == 0


def test_when_decodes_fill_the_pool_the_latest_admission_is_preempted_and_resumes_later() -> None:
    loop = Loop(SMALL_POOL)
    engine = loop.engine
    capacity = engine.kv_capacity
    first = request(0.0, prompt=1000, output=6000, workload=WorkloadClass.BATCH, conversation=1)
    second = request(0.001, prompt=1000, output=6000, workload=WorkloadClass.BATCH, conversation=2)
    engine.enqueue(first, 0.0)
    engine.enqueue(second, 0.001)
    while engine.preemptions == 0 and loop.events:
        loop.next()
        assert engine.kv_used <= capacity + 2  # one step's tokens past it at most
    assert second.preemptions == 1 and first.preemptions == 0
    streamed = second.generated
    assert 3000 < streamed < 6000  # the two filled the pool about half way through their outputs
    first_token = second.first_token_s
    assert second in engine.waiting[2]
    loop.run_until(10_000.0)
    assert first.done_s > 0 and second.done_s > first.done_s
    assert second.first_token_s == first_token and second.generated == second.output
    assert engine.recomputed_tokens == 1000 + streamed - second.cached > 0
    assert engine.kv_used == pytest.approx(0.0) and engine.num_running == 0


def test_a_lone_sequence_is_never_preempted_even_past_the_pool() -> None:
    loop = Loop(SMALL_POOL)
    alone = request(0.0, prompt=1000, output=2 * loop.engine.kv_capacity, workload=WorkloadClass.BATCH)
    loop.engine.enqueue(alone, 0.0)
    loop.run_until(1e6)
    assert alone.done_s > 0 and alone.preemptions == 0


def test_a_busy_mixed_load_conserves_every_token() -> None:
    """Many requests of every class on a small pool: each is served once, whole, however often it was
    preempted, and the pool is empty at the end."""
    rng = random.Random(5)
    loop = Loop(replace(SMALL_POOL, itl_min_efficiency=0.9, layers=30))
    classes = list(WorkloadClass)[1:]  # every class but UNSPECIFIED
    sent = []
    t = 0.0
    for k in range(300):
        t += rng.expovariate(20.0)
        wc = rng.choice(classes)
        if wc == WorkloadClass.EMBEDDING:
            r = request(t, rng.randint(5, 200), 0, wc, model="e")
        else:
            r = request(t, rng.randint(10, 3000), rng.randint(1, 800), wc, conversation=1 + k % 40)
        loop.run_until(t)
        loop.engine.enqueue(r, t)
        sent.append(r)
    loop.run_until(1e6)
    engine = loop.engine
    assert sorted(r.id for r in loop.done) == sorted(r.id for r in sent)
    assert engine.preemptions > 0 and engine.decoded_tokens == sum(r.output for r in sent)
    assert all(r.arrival_s <= r.first_token_s <= r.done_s and r.generated == r.output for r in sent)
    assert engine.kv_used == pytest.approx(0.0, abs=1e-6) and engine.kv_prompts == 0


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


def test_a_clock_change_mid_decode_keeps_a_waiting_prompts_wake_up_at_the_new_speed() -> None:
    """A chat prompt waits half a layer of the running decode step; the clock halves meanwhile (a
    thermal cut, or a shared host's share): it waits the rest of that at half speed, not for the end of
    the 400-token stretch the decode is planned as, and its own step runs at half speed."""
    loop = Loop(replace(PROFILE, layers=10, preempt_granularity_s=1.0))
    long = request(0.0, prompt=100, output=400, workload=WorkloadClass.BATCH)
    loop.engine.enqueue(long, 0.0)
    loop.run_until(0.0205)
    chat = request(0.0205, prompt=100, output=2)
    loop.engine.enqueue(chat, 0.0205)
    loop.engine.set_clock(0.0205, 0.5)
    loop.run_until(10.0)
    wait = 0.011 / 20  # half a layer of the 11 ms decode step, at full clock
    assert chat.first_token_s == pytest.approx(0.0205 + 2 * wait + 2 * (0.010 + 0.001 + 100 * 0.0001))


def test_an_encoder_without_a_wait_runs_the_moment_it_arrives() -> None:
    loop = Loop(replace(PROFILE, encoder_wait_s=0.0))
    r = request(0.0, prompt=100, output=50)
    loop.engine.enqueue(r, 0.0)
    loop.run_until(0.2)
    e = request(0.2, prompt=100, output=0, workload=WorkloadClass.EMBEDDING, model="e")
    loop.engine.enqueue(e, 0.2)
    assert e.done_s == pytest.approx(0.2 + 0.001 + 100 * 0.00001)


def test_an_encoder_sharing_the_core_takes_twice_its_encode_beside_a_busy_decoder_and_its_own_alone() -> None:
    # A CPU worker's encoder thread shares its core with the decoder's: half the core while the decoder
    # works, so the embedding takes twice its 2 ms encode, and the decode in progress loses 2 ms.
    loop = Loop(replace(PROFILE, encoder_wait_s=0.0, encoder_core_share=0.5))
    alone = request(0.0, prompt=100, output=0, workload=WorkloadClass.EMBEDDING, model="e")
    loop.engine.enqueue(alone, 0.0)
    assert alone.done_s == pytest.approx(0.002)
    r = request(0.1, prompt=100, output=3)
    loop.engine.enqueue(r, 0.1)
    loop.run_until(0.121)  # prompt step 0.1-0.12 (10 ms + 100 x 0.1 ms), then decodes of 11 ms
    e = request(0.121, prompt=100, output=0, workload=WorkloadClass.EMBEDDING, model="e")
    loop.engine.enqueue(e, 0.121)
    assert e.done_s == pytest.approx(0.121 + 2 * 0.002)
    loop.run_until(10.0)
    assert r.done_s == pytest.approx(0.12 + 2 * 0.011 + 0.002)


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


def test_a_prompt_from_position_0_pays_half_the_attention_of_one_continuing_a_cached_prefix() -> None:
    # A first chunk runs causally (n(n + 1) / 2 pairs); one after a cached prefix meets every key (n x
    # (start + n)): services/worker/engine/attention_work.py, which the step log is fitted with.
    cost = replace(DECODER, per_prefill_token_s=0.0, per_prefill_attention_s=1e-6)
    assert cost.prompt_s(0, 1000) == pytest.approx(1000 * 1001 / 2 * 1e-6)
    assert cost.prompt_s(1000, 1000) == pytest.approx(1000 * 2000 * 1e-6)
