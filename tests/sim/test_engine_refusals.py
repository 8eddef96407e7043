"""The simulated engine's queue timeout: what the worker refuses after its class's timeout (for the
gateway to move), and what it never refuses."""

from __future__ import annotations

import pytest

from services.common.workload import WorkloadClass
from tests.sim.test_engine_model import PROFILE, SMALL_POOL, Loop, request


@pytest.mark.parametrize("refusing", [True, False])
def test_a_prompt_never_scheduled_within_its_queue_timeout_is_refused_at_a_step_end(refusing: bool) -> None:
    """Eight chats hold every seat for ~18 s (decode steps of 18 ms); a ninth chat (timeout 5 s) and an
    agent call (10 s), which cannot displace them, are refused at the first step boundary past their
    timeouts; a document (600 s) waits and is served. Without on_refused every prompt waits its turn."""
    loop = Loop(refusing=refusing)
    engine = loop.engine
    seated = [request(0.0, prompt=100, output=1000) for _ in range(PROFILE.max_running)]
    for r in seated:
        engine.enqueue(r, 0.0)
    chat, agent = request(0.001, 100, 10), request(0.001, 100, 10, WorkloadClass.AGENT_TOOL)
    doc = request(0.001, 100, 10, WorkloadClass.BATCH)
    for r in (chat, agent, doc):
        engine.enqueue(r, 0.001)
    loop.run_until(1e4)
    decode_step = 0.010 + 0.001 * PROFILE.max_running
    if not refusing:
        assert all(r.done_s > 0 for r in (*seated, chat, agent, doc)) and engine.queue_timeouts == 0
        return
    assert [r for r, _ in loop.refused] == [chat, agent] and engine.queue_timeouts == 2
    for (r, when), timeout in zip(loop.refused, (5.0, 10.0), strict=True):
        assert 0.001 + timeout <= when <= 0.001 + timeout + decode_step + 1e-9
        assert r.first_token_s < 0 and r.admit_no == 0 and r not in loop.done
    assert doc.done_s > max(r.done_s for r in seated) and engine.num_waiting == 0


def test_a_preempted_sequence_resumes_however_long_it_waits() -> None:
    """The worker refuses only what it never scheduled: a preempted chat waits past its 5 s timeout for
    the pool (the first chat holds it to its end) and resumes."""
    loop = Loop(SMALL_POOL, refusing=True)
    engine = loop.engine
    first, second = request(0.0, prompt=1000, output=6000), request(0.001, prompt=1000, output=6000)
    engine.enqueue(first, 0.0)
    engine.enqueue(second, 0.001)
    loop.run_to_preemption()
    preempted_at, admitted = engine.t, second.admit_no
    while second.admit_no == admitted and loop.events:
        loop.next()
    assert second.preemptions == 1 and engine.t - preempted_at > 5.0
    loop.run_until(1e6)
    assert loop.refused == [] and loop.done == [first, second]
