"""What the simulator feeds the placer's prefix cost rule: each engine's latency prefill in its
heartbeats, and where its prompts' prefix chain elements end."""

from __future__ import annotations

import pytest

from services.common.workload import WorkloadClass
from sim.config import Models, WorkloadConfig
from sim.request import sim_prefix_ends
from sim.sharegpt import conversations
from sim.trace import TraceWorkload, build_trace
from sim.workload import Workload
from tests.sim.test_engine_model import Loop, request

CHAT, AGENT, BATCH = WorkloadClass.REALTIME_CHAT, WorkloadClass.AGENT_TOOL, WorkloadClass.BATCH


def test_an_engine_reports_the_latency_prefill_it_has_left() -> None:
    """Queued latency prompts count what the prefix cache does not hold of them (nothing here), admitted
    ones what their steps have not computed, batch never (the worker's Scheduler.latency_prompt_tokens)."""
    loop = Loop()
    engine = loop.engine
    engine.enqueue(request(0.0, prompt=3000, output=4), 0.0)  # over the 2,048-token budget: two steps
    engine.enqueue(request(0.0, prompt=500, output=4, workload=BATCH), 0.0)
    engine.enqueue(request(0.0, prompt=700, output=4, workload=AGENT), 0.0)
    assert engine.latency_prompt_tokens() == 3700
    loop.next()  # the first step starts: admitted, nothing computed yet
    assert engine.latency_prompt_tokens() == 3700
    loop.next()  # it ends: 2,048 of the chat prompt computed
    assert engine.latency_prompt_tokens() == 3700 - 2048
    loop.run_until(60.0)
    assert engine.latency_prompt_tokens() == 0 and len(loop.done) == 3


def test_a_queued_follow_up_counts_only_what_its_engine_has_not_cached() -> None:
    """An agent session's next call queued where its history is cached counts its new tokens, as the
    worker's queue does (WaitingCounts looks each latency sequence up as it joins): the same tokens the
    engine skips at admission."""
    loop = Loop()
    engine = loop.engine
    engine.enqueue(request(0.0, prompt=1000, output=4, workload=AGENT, conversation=5), 0.0)
    loop.run_until(60.0)
    follow_up = request(60.0, prompt=1600, output=4, workload=AGENT, conversation=5)
    engine.enqueue(follow_up, 60.0)
    engine.enqueue(request(60.0, prompt=300, output=4, workload=BATCH, conversation=6), 60.0)
    queued = engine.latency_prompt_tokens()
    loop.next()  # admitted: its hit is known
    assert follow_up.cached >= 992  # the first call's whole blocks
    assert queued == 1600 - follow_up.cached


def test_chain_ends_follow_what_the_placer_was_sent() -> None:
    # A chat conversation: one element, at the previous turn's prompt (0 before its first).
    assert sim_prefix_ends((7,), 0, 0) == (0,)
    assert sim_prefix_ends((7,), 0, 900) == (900,)
    # An agent session: its tenant's tools, then its own history.
    assert sim_prefix_ends((1, 7), 2000, 0) == (2000, 2000)
    assert sim_prefix_ends((1, 7), 2000, 3900) == (2000, 3900)
    # A batch document: its job's instruction.
    assert sim_prefix_ends((3,), 300, 0) == (300,)
    assert sim_prefix_ends((), 0, 0) == ()


@pytest.fixture(scope="module")
def turns() -> list:
    return conversations(300)


def test_workload_and_trace_give_each_turn_the_previous_prompt_as_its_history(turns: list) -> None:
    config = WorkloadConfig(duration_s=30.0)
    workload = Workload(config, 16, ["z0"], turns, seed=3)
    trace = TraceWorkload(build_trace(config, 16, ["z0"], turns, 3, Models()), Models())
    for source in (workload, trace):
        checked = 0
        for first in source.arrivals():
            if first.workload not in (CHAT, AGENT):
                continue
            first.done_s = first.arrival_s
            follow = source.follow_up(first)
            if follow is None:
                continue
            assert follow.prefix_ends[-1] == first.prompt, source
            assert len(follow.prefix_ends) == len(follow.prefix_chain)
            checked += 1
        assert checked > 10
