"""A tiny trace served by a real in-process mesh (tiny decoder, real MiniLM) and by the simulated mesh:
the same requests, the same token counts; and the trace itself is fixed by its seed."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from bench.fidelity_replay import Tokens, replay
from services.common.redis_server import RedisServer
from services.common.workload import WorkloadClass
from sim.calibrate import single_token_words
from sim.cpu_profile import NEUTRAL_THERMAL
from sim.fidelity import (
    CHAT_MODEL,
    EMBED_MODEL,
    MESH_NODES,
    SESSION_RATES,
    FidelityPlan,
    Served,
    class_metrics,
    embeddings_beside_decoders,
    headline,
    load_scale_of,
    make_trace,
    matched_metrics,
    mesh_workload,
    metric_ranges,
    outside_range,
    pooled_metrics,
    relative_errors,
    routing_shares,
    simulate,
)
from sim.fit import TERMS
from sim.profiles import GpuProfile, ModelCost
from sim.request import QUEUE_TIMEOUT_S
from sim.sharegpt import conversations
from sim.trace import TraceLimits
from tests.mesh_e2e.conftest import API_KEY, running_mesh

# Every class, multi-turn chat within a few seconds, prompts within the tiny model's 1,024 positions.
PLAN = FidelityPlan(
    mesh_workload(6.0, chat_rate=0.4, agent_rate=0.3, batch_rate=0.4, embedding_rate=0.5, chat_think_s=0.5,
                  agent_tool_s=0.3),
    limits=TraceLimits(max_output=4, max_prompt=1000, max_embedding_tokens=64),
)  # fmt: skip
TINY_IDS = (4, 500)  # tests/conftest.py's tiny vocabulary is 512


def _cost(name: str, embedding: bool) -> ModelCost:
    coefficients = dict(zip(TERMS, (0.002, 1e-4, 1e-7, 2e-5, 1e-9), strict=True))
    return ModelCost(name, **coefficients, weight_bytes=10**6, kv_bytes_per_token=0 if embedding else 1024,
                     load_s=0.1, reload_s=0.1, embedding=embedding)  # fmt: skip


PROFILE = GpuProfile(
    name="test-cpu", memory_bytes=10**9, token_budget=512, max_running=8, preempt_granularity_s=0.001,
    models={CHAT_MODEL: _cost(CHAT_MODEL, False), EMBED_MODEL: _cost(EMBED_MODEL, True)},
    thermal=NEUTRAL_THERMAL,
)  # fmt: skip


@pytest.fixture(scope="module")
def turns() -> list:
    return conversations(300)


def _key(requests: list) -> Counter:
    return Counter((r.workload, r.session, r.turn, r.prompt, r.output) for r in requests)


def test_the_trace_is_fixed_by_its_seed_and_spans_the_classes(turns: list) -> None:
    trace = make_trace(PLAN, turns)
    assert trace == make_trace(PLAN, turns)
    assert trace != make_trace(replace(PLAN, seed=1), turns)
    classes = {s.workload for s in trace.sessions}
    assert {WorkloadClass.REALTIME_CHAT, WorkloadClass.BATCH, WorkloadClass.EMBEDDING} <= classes
    assert any(len(s.turns) > 1 for s in trace.sessions)  # later turns carry earlier ones
    for s in trace.sessions:
        assert all(s.prompt(k) <= PLAN.limits.max_prompt for k in range(len(s.turns)))
        assert all(t.output <= PLAN.limits.max_output for t in s.turns)


def test_a_load_scale_scales_every_class_alike_and_is_read_back(turns: list) -> None:
    base, half = mesh_workload(600.0), mesh_workload(600.0, 0.5)
    for rate in SESSION_RATES:
        assert getattr(half, rate) == pytest.approx(getattr(base, rate) / 2)
    assert half.batch_prompt_median == base.batch_prompt_median  # the mix's shape stays
    assert (load_scale_of(base), load_scale_of(half)) == (1.0, 0.5)
    full, scaled = (make_trace(FidelityPlan(w), turns).requests() for w in (base, half))
    assert 0.35 < scaled / full < 0.65


def test_the_simulated_mesh_serves_every_request_of_the_trace(turns: list) -> None:
    trace = make_trace(PLAN, turns)
    served, sim = simulate(trace, PROFILE, PLAN.seed, turns)
    assert len(served) == trace.requests()
    assert {e.index for e in sim.engines if e.decoded_tokens} == {0, 1}  # both workers take work


def test_a_prompt_past_its_queue_timeout_moves_to_the_other_worker_as_the_gateway_does(turns: list) -> None:
    """Prompt tokens 200 times dearer than PROFILE's: chats queue behind chats for longer than their 5 s
    timeout, the worker refuses them, and the gateway tries the other worker; one refused by both is
    refused to its caller. Every request issued is served or refused, none twice by the same worker."""
    slow_chat = replace(PROFILE.models[CHAT_MODEL], per_prefill_token_s=0.02)
    slow = replace(PROFILE, models={**PROFILE.models, CHAT_MODEL: slow_chat})
    trace = make_trace(PLAN, turns)
    served, sim = simulate(trace, slow, PLAN.seed, turns)
    completed = sim.workload.completed  # type: ignore[union-attr]
    moved = [r for r in completed if r.excluded]
    refusals = sim.summary()["retries"]["queue_timeout"]  # type: ignore[index]
    assert refusals > 0 and moved
    for r in moved:
        assert MESH_NODES[r.gpu] not in r.excluded and r.attempts == len(r.excluded) + 1
        assert r.first_token_s - r.arrival_s >= QUEUE_TIMEOUT_S[r.workload]  # a whole timeout at the first
    rejected = sum(c.rejected for c in sim.classes.values())
    assert rejected > 0 and refusals == len(moved) + 2 * rejected
    failed = [s for s in served if s.status != "OK"]  # as the real side records a request the gateway refused
    assert len(failed) == rejected and all(
        s.status == "RESOURCE_EXHAUSTED" and s.ttft_s is None for s in failed
    )
    later_turns = sum(r.follow_up[1] + 1 < len(r.follow_up[0].turns) for r in completed)
    assert len(trace.sessions) + later_turns == len(completed) + rejected


def test_repeats_pool_their_requests_and_average_their_throughput() -> None:
    """Two runs of one trace: percentiles over both runs' requests, throughput per run."""

    def chat(ttft_s: float, done_s: float) -> Served:
        return Served(WorkloadClass.REALTIME_CHAT, 0, 0, 0.0, ttft_s, done_s, prompt=10, output=20)

    first = [chat(0.1, 1.0), chat(0.2, 2.0)]
    second = [chat(0.3, 3.0), chat(9.0, 50.0)]  # its slow request ends past the 10 s window
    pooled = pooled_metrics([first, second], 10.0)["realtime_chat"]
    alone = class_metrics(first + second, 10.0)["realtime_chat"]
    assert pooled["requests"] == 4 and pooled["ttft_p99_s"] == alone["ttft_p99_s"]
    assert pooled["ttft_p50_s"] == pytest.approx(0.25)
    assert pooled["throughput"] == pytest.approx((40 + 20) / 10.0 / 2)  # 3 of 4 in the window, over 2 runs
    assert pooled_metrics([first], 10.0) == class_metrics(first, 10.0)


def test_a_simulated_pass_is_pooled_as_often_as_the_real_repeats_it_is_scored_against() -> None:
    # Three real repeats that each served exactly as the simulation did: no error. Scored alone, the pass's
    # p99 of 67 turns interpolates between its two slowest (1.86 s), the pool's is the slowest (4 s).
    turns = [
        Served(WorkloadClass.REALTIME_CHAT, i, 0, 0.0, 0.1 + i / 100, 1.0, prompt=10, output=20)
        for i in range(66)
    ]
    simulated = [*turns, replace(turns[0], session=66, ttft_s=4.0)]
    real = pooled_metrics([simulated] * 3, 10.0)
    matched = relative_errors(real, matched_metrics(simulated, 10.0, 3))["realtime_chat"]
    assert matched == {"ttft_p50_s": 0.0, "ttft_p99_s": 0.0, "throughput": 0.0}
    alone = relative_errors(real, class_metrics(simulated, 10.0))["realtime_chat"]
    assert alone["ttft_p99_s"] == pytest.approx(1 - 1.855 / 4.0)


def test_each_embedding_is_marked_by_whether_a_decoder_worked_beside_it() -> None:
    def served(workload: WorkloadClass, node: str, arrival_s: float, done_s: float) -> Served:
        return Served(workload, 0, 0, arrival_s, done_s - arrival_s, done_s, prompt=7, output=0, node=node)

    chat = served(WorkloadClass.REALTIME_CHAT, "w1", 1.0, 3.0)
    alone = served(WorkloadClass.EMBEDDING, "w2", 2.0, 2.01)  # w2 decodes nothing then
    beside = served(WorkloadClass.EMBEDDING, "w1", 2.0, 2.03)  # w1 is serving the chat
    after = served(WorkloadClass.EMBEDDING, "w1", 3.5, 3.51)
    failed = replace(served(WorkloadClass.EMBEDDING, "w2", 4.0, 4.0), ttft_s=None, done_s=None)
    assert embeddings_beside_decoders([chat, alone, beside, after, failed]) == [
        (7, alone.ttft_s, False), (7, beside.ttft_s, True), (7, after.ttft_s, False),
    ]  # fmt: skip


async def test_the_real_mesh_and_the_simulation_agree_on_requests_and_tokens(
    redis_server: RedisServer, llama_gqa_dir: Path, minilm_dir: Path, turns: list
) -> None:
    trace = make_trace(PLAN, turns)
    simulated, _ = simulate(trace, PROFILE, PLAN.seed, turns)
    models = {CHAT_MODEL: llama_gqa_dir, EMBED_MODEL: minilm_dir}
    words = single_token_words(minilm_dir / "tokenizer.json")
    async with running_mesh(redis_server.url, models, placement="embedded", max_num_seqs=8) as mesh:
        real = await replay(trace, mesh.gateway.address, API_KEY, Tokens(PLAN.seed, words, TINY_IDS))
    assert [r.status for r in real if r.status != "OK"] == []
    assert _key(real) == _key(simulated)
    real_metrics, sim_metrics = class_metrics(real, 1e9), class_metrics(simulated, 1e9)
    for name, measured in real_metrics.items():
        for field in ("requests", "prompt_tokens", "output_tokens"):
            assert measured[field] == sim_metrics[name][field], (name, field)
    errors = relative_errors(real_metrics, sim_metrics)
    assert headline(errors, "throughput") == 0.0  # every token counted on both sides (no window cut)
    # Both sides say which worker served each request; each class's shares cover its requests.
    assert {r.node for r in real} == {"w1", "w2"} and {r.node for r in simulated} == set(MESH_NODES)
    for shares in (routing_shares(real), routing_shares(simulated)):
        for name, per_node in shares.items():
            served_any = 1.0 if real_metrics[name]["requests"] else 0.0
            assert sum(per_node.values()) == pytest.approx(served_any, abs=1e-3), name


def test_the_fit_spread_is_each_figures_range_and_how_far_real_lies_outside() -> None:
    runs = [
        {"chat": {"ttft_p50_s": 0.2, "ttft_p99_s": 1.0, "throughput": 10.0}},
        {"chat": {"ttft_p50_s": 0.4, "ttft_p99_s": 2.0, "throughput": 12.0}},
        {"chat": {"ttft_p50_s": 0.3, "ttft_p99_s": None, "throughput": 11.0}},
    ]
    ranges = metric_ranges(runs)
    assert ranges == {"chat": {"ttft_p50_s": [0.2, 0.4], "ttft_p99_s": None, "throughput": [10.0, 12.0]}}
    real = {"chat": {"ttft_p50_s": 0.25, "ttft_p99_s": 1.5, "throughput": 15.0}}
    assert outside_range(real, ranges) == {
        "chat": {"ttft_p50_s": 0.0, "ttft_p99_s": None, "throughput": pytest.approx(0.2)}
    }
    assert outside_range({"chat": {"ttft_p50_s": 0.1}}, ranges)["chat"]["ttft_p50_s"] == pytest.approx(1.0)
