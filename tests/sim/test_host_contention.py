"""The CPU mesh's slowdown per request in flight: counted across the workers' step logs, fitted with the
step costs, and applied by the simulation to every engine's steps; and a request alone in the simulated
mesh takes exactly its steps' time, which is what shows the slowdown (and showed a heartbeat bug)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from bench.fidelity_steps import out_of_sample
from services.worker.engine.step_log import StepLog
from sim.fidelity import CHAT_MODEL, FidelityPlan, Served, make_trace, mesh_workload, simulate
from sim.fit import TERMS, StepSample
from sim.fleet import NetworkCosts
from sim.host_contention import fit_with_slowdown, in_flight_per_step
from sim.serving_fit import logs_by_model, serving_calibration
from sim.sharegpt import conversations
from sim.trace import TraceLimits
from tests.sim.test_fidelity import PROFILE
from tests.sim.test_serving_fit import SERVING, _calibration

PLANTED = 0.02  # seconds x (1 + 0.02 per request in flight)


def _step(end: float, seconds: float, running: int, waiting: int) -> dict[str, object]:
    return {"batches": 1, "rows": running, "context": 100 * running, "prefill": 0, "attention": 0,
            "seconds": seconds, "running": running, "waiting": waiting, "end": end}  # fmt: skip


def test_a_step_counts_its_own_queues_and_the_other_workers_step_at_its_midpoint() -> None:
    first = [_step(1.0, 1.0, 2, 1), _step(3.0, 1.0, 4, 0), _step(10.0, 1.0, 1, 0)]
    # The second worker: a step over [0.2, 0.8], idle until 2.0, a step over [2.0, 4.0].
    second = [_step(0.8, 0.6, 3, 2), _step(4.0, 2.0, 5, 1)]
    assert in_flight_per_step([first, second]) == [
        [3 + 5, 4 + 6, 1],  # midpoints 0.5 (inside [0.2, 0.8]), 2.5 (inside [2, 4]), 9.5 (idle)
        [5 + 3, 6 + 4],  # midpoints 0.5 (inside [0, 1]) and 3.0 (its first step's [2, 3] ends there)
    ]


def _samples() -> tuple[list[StepSample], list[int]]:
    """Decodes and prompts timed by SERVING, slowed by PLANTED per request in flight."""
    samples, counts = [], []
    shapes = [(r, r * c, 0, 0) for r, c in itertools.product((1, 3, 8), (40, 600, 1500))]
    shapes += [(0, 0, n, n * n) for n in (16, 200, 1024)] + [(5, 3000, 128, 128 * 128)]
    for (rows, context, prefill, attention), in_flight in itertools.product(shapes, (0, 4, 9, 20)):
        features = (1, rows, context, prefill, attention)
        seconds = sum(SERVING[t] * f for t, f in zip(TERMS, features, strict=True)) * (
            1 + PLANTED * in_flight
        )
        samples.append(StepSample(rows, context, prefill, attention, seconds))
        counts.append(in_flight)
    return samples, counts


def test_the_fit_finds_a_planted_slowdown_and_the_costs_under_it() -> None:
    samples, counts = _samples()
    slowdown, fit = fit_with_slowdown(samples, counts)
    assert slowdown == pytest.approx(PLANTED)
    for term in TERMS:
        assert fit.coefficients[term] == pytest.approx(SERVING[term], rel=1e-6, abs=1e-12)
    assert fit.rms_relative == pytest.approx(0.0, abs=1e-9)  # the whole model's residual, not the scaled one
    # Without counts that vary, there is nothing to tell a slowdown from costs: none is fitted.
    assert fit_with_slowdown(samples, [0] * len(samples))[0] == 0.0
    with pytest.raises(ValueError, match="3 steps but 2 counts"):
        fit_with_slowdown(samples[:3], counts[:2])


def test_the_serving_calibration_fits_the_slowdown_from_two_workers_logs(tmp_path: Path) -> None:
    """Two workers' logs, each step timed by SERVING x (1 + PLANTED x the mesh's requests in flight)."""
    logs = [StepLog(tmp_path / f"worker-{pid}-chat-model.jsonl") for pid in (1, 2)]
    for k, (rows, other_waiting) in enumerate(itertools.product((1, 3, 8) * 9, (0, 6))):
        queues = [(rows, 0), (k % 4, other_waiting)]  # (running, waiting) of each worker
        in_flight = rows + k % 4 + other_waiting
        # Both steps end together and take 60-110 ms, so each one's midpoint lies inside the other.
        for log, (running, waiting) in zip(logs, queues, strict=True):
            seconds = (SERVING["base_s"] + SERVING["per_row_s"] * running) * (1 + PLANTED * in_flight)
            log.write({**_step(k + 1.0, seconds, running, waiting), "context": 0})
    for log in logs:
        log.close()
    fitted = serving_calibration(_calibration(), logs_by_model(tmp_path), samples_per_term=2)
    chat = fitted["models"]["chat-model"]  # type: ignore[index]
    assert chat["host_slowdown_per_request"] == pytest.approx(PLANTED)
    assert chat["coefficients"]["per_row_s"] == pytest.approx(SERVING["per_row_s"], rel=1e-6)
    predicted = out_of_sample(fitted, tmp_path)["chat-model"]
    assert predicted["median_abs_relative_error"] == pytest.approx(0, abs=1e-9)
    linear = serving_calibration(_calibration(), logs_by_model(tmp_path), samples_per_term=2, slowdown=False)
    assert linear["models"]["chat-model"]["host_slowdown_per_request"] == 0.0  # type: ignore[index]
    assert linear["models"]["chat-model"]["rms_relative_residual"] > 0.03  # type: ignore[index]


def _alone(run: list[Served], network_s: float) -> set[tuple[object, int, int]]:
    """The requests of run that were the only one in the mesh from arrival to their last token."""
    spans = [(s.arrival_s, s.done_s - network_s) for s in run if s.done_s is not None]
    return {
        (s.workload, s.session, s.turn)
        for s, (start, end) in zip(run, spans, strict=True)
        if sum(1 for a, d in spans if a < end and d > start) == 1  # only itself
    }


# Sessions far apart, so most requests are the only one in flight while they run.
SPARSE = FidelityPlan(
    mesh_workload(120.0, chat_rate=0.05, agent_rate=0.0, batch_rate=0.05, embedding_rate=0.0),
    limits=TraceLimits(max_output=4, max_prompt=500, max_embedding_tokens=64),
)
NETWORK_S = NetworkCosts().round_trip_s(True)  # simulate()'s default; callers and mesh in one zone


def test_a_request_alone_takes_its_steps_time_whenever_its_worker_heartbeats() -> None:
    """A heartbeat reports its engine as of the simulation's time: one that brought the engine to its
    own phase's time, up to a slice later, held back the decodes of a request that arrived meanwhile
    until the simulation caught up (a 67-token chat turn took 64 ms instead of 10)."""
    turns = conversations(300)
    served, _ = simulate(make_trace(SPARSE, turns), PROFILE, SPARSE.seed, turns)
    cost = PROFILE.models[CHAT_MODEL]
    first_turns = [s for s in served if s.turn == 0 and s.cached == 0 and s.prompt <= PROFILE.token_budget]
    alone = _alone(served, NETWORK_S)
    checked = 0
    for s in first_turns:
        if (s.workload, s.session, s.turn) not in alone:
            continue
        prompt_step = cost.base_s + cost.prompt_s(0, s.prompt)
        decode_step = cost.base_s + cost.per_row_s + cost.per_context_token_s * s.prompt
        assert s.done_s - NETWORK_S - s.arrival_s == pytest.approx(prompt_step + (s.output - 1) * decode_step)  # type: ignore[operator]
        checked += 1
    assert checked >= 5


def test_a_request_alone_in_the_mesh_runs_its_steps_slowed_by_one_request() -> None:
    """With a slowdown of k per request in flight, a request alone in the mesh takes (1 + k) times as
    long in the engine as without."""
    turns = conversations(300)
    trace = make_trace(SPARSE, turns)
    slowed = replace(PROFILE, host_slowdown_per_request=0.1)
    plain, contended = (simulate(trace, profile, SPARSE.seed, turns)[0] for profile in (PROFILE, slowed))
    alone = _alone(plain, NETWORK_S) & _alone(contended, NETWORK_S)
    assert len(alone) >= 5
    before = {(s.workload, s.session, s.turn): s for s in plain}
    after = {(s.workload, s.session, s.turn): s for s in contended}
    for key in alone:
        assert after[key].node == before[key].node
        engine_s = [s.done_s - NETWORK_S - s.arrival_s for s in (before[key], after[key])]  # type: ignore[operator]
        assert engine_s[1] == pytest.approx(1.1 * engine_s[0], rel=1e-9)
