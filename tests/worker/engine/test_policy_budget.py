"""The step budget: the step-time model and the controller, then the scheduler choosing a budget from
measured step times (shrinks for latency work in play, grows back with only batch work)."""

from __future__ import annotations

import pytest

from services.worker.engine.block_manager import BlockManager
from services.worker.engine.policy.budget import BudgetController, StepTimeModel
from services.worker.engine.policy.classes import PolicyConfig
from services.worker.engine.scheduler import Scheduler
from services.worker.engine.scheduler_config import SchedulerConfig
from tests.worker.engine.test_policy_scheduler import AGENT, BATCH, RT, T0, classes_with, ids, seq, step

# Measured on a made-up engine: bigger steps are more efficient per token, but longer.
STEP_SECONDS = {16: 0.02, 64: 0.05, 256: 0.125, 512: 0.2}


def trained(model: StepTimeModel | None = None, seqs: int = 2) -> StepTimeModel:
    model = model or StepTimeModel()
    for tokens, seconds in STEP_SECONDS.items():
        model.observe(tokens, seqs, seconds)
    return model


@pytest.mark.parametrize(
    ("tokens", "seqs", "expected"),
    [
        (64, 2, 0.05),  # measured
        (50, 2, 0.02 + 0.03 * 34 / 48),  # interpolated between the sizes measured, 16 and 64
        (128, 2, 0.05 + 0.075 * 64 / 192),  # interpolated between 64 and 256
        (1024, 2, 0.4),  # past the largest: scaled by tokens, an overestimate
        (8, 2, 0.02),  # below the smallest: the smallest's time, an overestimate
        (64, 1, 0.05),  # no data at 1 sequence: borrows the nearest larger count
    ],
)
def test_step_time_estimates(tokens: int, seqs: int, expected: float) -> None:
    assert trained().estimate(tokens, seqs) == pytest.approx(expected)


def test_step_time_model_follows_a_change_without_jumping_on_one_sample() -> None:
    model = StepTimeModel()
    model.observe(64, 2, 0.05)
    model.observe(64, 2, 0.5)  # one noisy step
    assert 0.05 < model.estimate(64, 2) < 0.2
    for _ in range(30):
        model.observe(64, 2, 0.5)
    assert model.estimate(64, 2) == pytest.approx(0.5, rel=0.01)
    assert StepTimeModel().estimate(64, 2) is None


@pytest.mark.parametrize(
    ("target_s", "floor", "expected"),
    [
        (0.001, 10, 16),  # nothing meets it: the minimum (latency work is never cut)
        (0.2, 0, 512),
        (0.125, 0, 256),
        (0.13, 0, 272),  # between measured sizes: the largest multiple of the minimum that fits
        (0.1, 0, 192),
        (0.05, 0, 64),
        (0.001, 0, 16),  # nothing meets it: the minimum
        (0.001, 300, 300),  # the latency work's own tokens are never cut
        (0.05, 5000, 512),  # ... but the budget never exceeds the maximum
    ],
)
def test_controller_fits_the_target(target_s: float, floor: int, expected: int) -> None:
    controller = BudgetController(16, 512, trained())
    assert controller.choose(target_s, 2, floor) == expected


def test_unreachable_first_token_target_runs_the_latency_work_alone() -> None:
    controller = BudgetController(16, 512, trained())
    assert controller.choose(0.001, 2, floor=10, alone=10) == 10
    assert controller.choose(0.2, 2, floor=10, alone=10) == 512  # reachable: the target decides


def test_unreachable_target_does_not_shrink_steps_for_nothing() -> None:
    # A step's fixed cost dominates: 16 tokens take 20 ms, 64 take 23 ms. A 10 ms target is out of reach
    # either way, so the controller keeps the budget whose step is within 20% of the shortest.
    model = StepTimeModel()
    for tokens, seconds in {16: 0.020, 32: 0.021, 64: 0.023, 128: 0.03, 512: 0.06}.items():
        model.observe(tokens, 2, seconds)
    assert BudgetController(16, 512, model).choose(0.01, 2) == 64
    assert BudgetController(16, 512, model).choose(0.03, 2) == 128  # reachable: the target decides


def test_controller_grows_by_doubling_toward_the_best_throughput() -> None:
    controller = BudgetController(16, 512, trained())
    assert controller.choose(0.05, 2) == 64
    assert [controller.choose(None, 2) for _ in range(4)] == [128, 256, 512, 512]


def test_controller_stops_growing_where_throughput_stops_improving() -> None:
    model = StepTimeModel()
    for tokens, seconds in {16: 0.02, 64: 0.05, 256: 0.2, 512: 0.4}.items():  # flat past 64
        model.observe(tokens, 2, seconds)
    controller = BudgetController(16, 512, model)
    assert [controller.choose(None, 2) for _ in range(3)] == [64, 64, 64]


def test_controller_explores_upward_before_anything_is_measured() -> None:
    assert BudgetController(16, 512).choose(None, 4) == 512
    assert BudgetController(16, 512).choose(0.01, 4) == 512  # no data yet: keeps its budget, measures


def _scheduler(
    ttft_slo_s: float = 0.2,
    itl_slo_s: float = 0.05,
    layer_preemption: bool = True,
    itl_min_efficiency: float = 0.0,
) -> Scheduler:
    classes = classes_with(RT, ttft_slo_s=ttft_slo_s, itl_slo_s=itl_slo_s)
    policy = PolicyConfig(
        classes=classes,
        min_batched_tokens=16,
        latency_memory_s=1.0,
        layer_preemption=layer_preemption,
        itl_min_efficiency=itl_min_efficiency,
    )
    config = SchedulerConfig(max_model_len=8192, max_num_batched_tokens=512, policy=policy)
    sched = Scheduler(config, BlockManager(2048, 16))
    trained(sched.policy.budget.model)
    return sched


@pytest.mark.parametrize("layer_preemption", [False, True])
def test_budget_shrinks_while_a_realtime_request_decodes_and_grows_after(layer_preemption: bool) -> None:
    sched = _scheduler(itl_slo_s=0.05, layer_preemption=layer_preemption)
    sched.add(seq("doc", BATCH, prompt=4000, max_tokens=4))
    sched.add(seq("chat", RT, prompt=10, max_tokens=3))
    budgets = []
    now = T0
    for _ in range(12):
        batch = step(sched, now)
        assert batch is not None
        budgets.append(batch.budget)
        now += 0.05
    # The chat's prompt and two decodes: steps kept to its 50 ms inter-token target (64 tokens).
    assert budgets[1:3] == [64, 64]
    if layer_preemption:
        # Then only the document: a chat arriving now would run between the layers of the step, so the
        # budget grows at once.
        assert budgets[3] == 128
        return
    # Then only the document: steps stay short for latency_memory_s (another chat may arrive) ...
    assert budgets[3] == 64
    # ... and after it the budget doubles toward the most efficient measured size.
    later = []
    for _ in range(6):
        batch = step(sched, now + 2.0)
        assert batch is not None
        later.append(batch.budget)
    assert later[:4] == [128, 256, 512, 512]


def test_inter_token_target_is_bounded_by_efficiency_but_first_token_slack_is_not() -> None:
    sched = _scheduler(ttft_slo_s=0.1, itl_slo_s=0.05, itl_min_efficiency=0.75)
    sched.add(seq("doc", BATCH, prompt=4000, max_tokens=4))
    sched.add(seq("chat", RT, prompt=10, max_tokens=3, arrival=T0))
    first = sched.schedule(T0 + 0.09)  # 10 ms of first-token slack: the chat alone, however inefficient
    assert first is not None and first.budget == 10
    sched.update(first, [7] * len(first.seqs))
    # Decoding: the 50 ms inter-token target alone would allow 64 tokens (1280 tokens/s); the bound keeps
    # 75% of the best rate (2560 tokens/s at 512), which 192 tokens do.
    batch = sched.schedule(T0 + 0.1)
    assert batch is not None and batch.budget == 192


def test_waiting_realtime_request_caps_the_step_at_its_ttft_slack() -> None:
    sched = _scheduler(ttft_slo_s=0.1)
    sched.add(seq("doc", BATCH, prompt=4000, max_tokens=4))
    step(sched)  # doc alone: the full budget
    sched.add(seq("chat", RT, prompt=10, arrival=T0))
    batch = sched.schedule(T0)
    assert batch is not None and batch.budget == 192  # predicted 100 ms: all of the 100 ms of slack
    assert batch.seqs[0].request_id == "chat"
    late = _scheduler(ttft_slo_s=0.1)
    late.add(seq("doc", BATCH, prompt=4000, max_tokens=4))
    step(late)
    late.add(seq("chat", RT, prompt=10, arrival=T0))
    batch = late.schedule(T0 + 0.09)  # 10 ms of slack, less than any step with batch work: chat alone
    assert batch is not None and batch.budget == 10 and ids(batch.seqs) == ["chat"]


def test_only_the_most_urgent_levels_tokens_are_exempt_from_the_budget() -> None:
    sched = _scheduler(ttft_slo_s=0.1)
    sched.add(seq("doc", BATCH, prompt=4000, max_tokens=4))
    step(sched)
    sched.add(seq("chat", RT, prompt=10, arrival=T0))
    sched.add(seq("tool", AGENT, prompt=300, arrival=T0))
    batch = sched.schedule(T0 + 0.05)  # 50 ms of the chat's slack left: a 64-token step fits
    assert batch is not None
    # The agent's prompt is chunked to what is left of the 64 tokens, not exempt like the chat's.
    assert list(zip(ids(batch.seqs), batch.num_tokens, strict=True)) == [("chat", 10), ("tool", 54)]


def test_less_urgent_latency_work_past_half_its_ttft_target_is_exempt_too() -> None:
    sched = _scheduler(ttft_slo_s=0.1)
    sched.add(seq("doc", BATCH, prompt=4000, max_tokens=4))
    step(sched)
    sched.add(seq("chat", RT, prompt=10, arrival=T0))
    sched.add(seq("tool", AGENT, prompt=300, arrival=T0 - 0.2))  # 290 of its 300 ms are gone
    batch = sched.schedule(T0 + 0.09)
    assert batch is not None
    assert list(zip(ids(batch.seqs), batch.num_tokens, strict=True)) == [("chat", 10), ("tool", 300)]


def test_fifo_budget_is_fixed() -> None:
    config = SchedulerConfig(max_model_len=8192, max_num_batched_tokens=512, policy=PolicyConfig(name="fifo"))
    sched = Scheduler(config, BlockManager(2048, 16))
    trained(sched.policy.budget.model)
    sched.add(seq("doc", BATCH, prompt=4000))
    sched.add(seq("chat", RT, prompt=10))
    assert step(sched).budget == 512  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("target_s", "min_efficiency", "expected"),
    [
        # Rates measured: 16 tokens 800/s, 64: 1280/s, 256: 2048/s, 512: 2560/s (the best).
        (0.05, 0.0, 64),  # unbounded: the target decides
        (0.05, 0.5, 64),  # 64 tokens keep 50% of the best rate: the target still decides
        (0.05, 0.75, 192),  # 75% = 1920/s: 192 tokens in an interpolated 100 ms, the smallest that keep it
        (0.05, 1.0, 512),  # nothing but the best
        (0.2, 0.9, 512),  # a target that allows more is not cut by the bound
    ],
)
def test_inter_token_target_shrinks_steps_only_while_they_stay_efficient(
    target_s: float, min_efficiency: float, expected: int
) -> None:
    controller = BudgetController(16, 512, trained())
    assert controller.choose(target_s, 2, min_efficiency=min_efficiency) == expected


def test_efficiency_bound_waits_for_measurements() -> None:
    assert BudgetController(16, 512).choose(0.05, 2, min_efficiency=0.9) == 512  # keeps its budget
    model = StepTimeModel()
    model.observe(64, 2, 0.05)  # one size measured: every budget extrapolates to its rate
    assert BudgetController(16, 512, model).choose(0.05, 2, min_efficiency=0.9) == 64


def test_efficiency_bound_expects_bigger_steps_to_spread_their_fixed_cost() -> None:
    # Only 128 and 256 tokens measured (32 and 49 ms): 17 ms per 128 more tokens, 15 ms fixed. Past them
    # the line predicts 1024 tokens in 151 ms (6781 tokens/s, the best); 90% of that first at 496 tokens.
    model = StepTimeModel()
    model.observe(128, 64, 0.032)
    model.observe(256, 64, 0.049)
    assert BudgetController(16, 1024, model).choose(0.03, 64, min_efficiency=0.9) == 496
    assert model.estimate(1024, 64) == pytest.approx(0.049 * 4)  # the SLO estimate stays on the safe side


def test_a_target_below_every_measured_step_brings_the_budget_down_to_measure_a_small_one() -> None:
    """Only full prefill steps measured (1024 tokens, 1.9 s, as SmolLM2 on one core), then a chat
    stream's 170 ms inter-token target: the budget goes down to the minimum to learn what a small step
    costs, rather than trusting the safe estimate that every step takes 1.9 s; measured, the budget
    settles where the target and the efficiency bound agree."""
    model = StepTimeModel()
    model.observe(1000, 8, 1.9)
    controller = BudgetController(16, 1024, model)
    assert controller.choose(0.17, 8, min_efficiency=0.9) == 16
    model.observe(16, 8, 0.065)  # the fixed cost of a step: 63 ms
    assert 16 < controller.choose(0.17, 8, min_efficiency=0.9) < 1024
    assert model.estimate(16, 8, realistic=True) == pytest.approx(0.065)
