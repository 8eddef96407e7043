"""The fidelity trace scaled to an offered load: the plan it returns is offered that load on the profile
(within the tolerance, or the closest it found), its mix stays, and a load it cannot ask for is refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.fidelity import (
    SESSION_RATES,
    FidelityPlan,
    load_scale_of,
    make_trace,
    mesh_workload,
)
from sim.fidelity_load import load_of, plan_for_load, with_rates_scaled
from sim.sharegpt import conversations
from tests.sim.test_fidelity import PLAN, PROFILE

LONGER = replace(PLAN, workload=replace(PLAN.workload, duration_s=30.0))  # enough sessions to scale smoothly


@pytest.fixture(scope="module")
def turns() -> list:
    return conversations(300)


def test_the_plan_found_is_offered_the_load_asked_for_with_the_same_mix(turns: list) -> None:
    as_given = load_of(LONGER, PROFILE, turns)
    for target in (as_given / 2, as_given * 1.6):
        plan, load = plan_for_load(target, LONGER, PROFILE, turns, tolerance=0.1)
        assert load == pytest.approx(target, rel=0.1)
        assert load_of(plan, PROFILE, turns) == pytest.approx(load)  # the load reported is the plan's own
        factor = plan.workload.chat_rate / LONGER.workload.chat_rate
        for rate in SESSION_RATES:
            assert getattr(plan.workload, rate) == pytest.approx(getattr(LONGER.workload, rate) * factor)
        assert plan.workload.chat_think_s == LONGER.workload.chat_think_s  # only the rates move
        assert (plan.seed, plan.limits, plan.workload.duration_s) == (LONGER.seed, LONGER.limits, 30.0)


def test_the_rate_found_is_recorded_exactly_enough_to_rebuild_its_trace(turns: list) -> None:
    """bench/sim_fidelity.py --resimulate rebuilds the trace from the result's load_scale."""
    mesh_scale = FidelityPlan(mesh_workload(60.0), limits=PLAN.limits)
    plan, _ = plan_for_load(
        1.7 * load_of(mesh_scale, PROFILE, turns), mesh_scale, PROFILE, turns, tolerance=0.01
    )
    rebuilt = replace(plan, workload=mesh_workload(60.0, load_scale_of(plan.workload)))
    assert rebuilt == plan and make_trace(rebuilt, turns) == make_trace(plan, turns)


def test_scaling_the_rates_by_one_keeps_the_plan() -> None:
    assert with_rates_scaled(PLAN, 1.0) == PLAN


def test_a_load_that_is_not_positive_is_refused(turns: list) -> None:
    with pytest.raises(ValueError, match="an offered load must be positive, got 0"):
        plan_for_load(0.0, PLAN, PROFILE, turns)
