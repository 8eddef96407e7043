"""The fidelity trace's rate for a given offered load on this machine.

The mesh scale's session rates (sim/fidelity.py) load each machine differently: the same trace offered
0.35 of one VM's capacity, 0.57 of a slower one's and 1.47 of a slower one still, and past saturation the
figures measure queues and refusals rather than serving. Asking for an offered load instead of a rate
puts every machine at the same point: the rate is scaled until the simulated mesh, on this machine's
calibrated profile, reports that load (`offered_load`, the work at best efficiency over the fleet's
seconds). The load grows about in proportion to the rate, so each step scales the rate by target / load,
bisecting once loads on both sides of the target are known; the trace is sampled, so the load moves in
steps and the search stops within a tolerance or after a few tries, keeping the closest. Factors are
rounded to the 6 digits the result's `load_scale` keeps, so `--resimulate` rebuilds the same trace.
"""

from __future__ import annotations

from dataclasses import replace

from sim.fidelity import SESSION_RATES, FidelityPlan, make_trace, offered_load, simulate
from sim.profiles import GpuProfile
from sim.sharegpt import Conversation

LOAD_TOLERANCE = 0.05  # relative: a few sessions more or less move a 180 s trace's load by about this much
MAX_TRIES = 8


def with_rates_scaled(plan: FidelityPlan, factor: float) -> FidelityPlan:
    """plan with every class's session rate times factor (the same mix, more or less of it)."""
    rates = {rate: getattr(plan.workload, rate) * factor for rate in SESSION_RATES}
    return replace(plan, workload=replace(plan.workload, **rates))


def load_of(plan: FidelityPlan, profile: GpuProfile, conversations: list[Conversation]) -> float:
    """The offered load plan's trace puts on the simulated mesh with profile's step costs."""
    _, sim = simulate(make_trace(plan, conversations), profile, plan.seed, conversations)
    return offered_load(sim)


def plan_for_load(
    target: float,
    plan: FidelityPlan,
    profile: GpuProfile,
    conversations: list[Conversation],
    tolerance: float = LOAD_TOLERANCE,
) -> tuple[FidelityPlan, float]:
    """plan with its session rates scaled so that its trace (its window, seed and mix) is offered target
    load on profile, and the load it is offered: within tolerance of target, or the closest of MAX_TRIES."""
    if not target > 0:
        raise ValueError(f"an offered load must be positive, got {target}")
    factor = 1.0
    tried: list[tuple[float, float, float]] = []  # (miss, factor, load), in the order tried
    for _ in range(MAX_TRIES):
        load = load_of(with_rates_scaled(plan, factor), profile, conversations)
        tried.append((abs(load / target - 1.0), factor, load))
        if tried[-1][0] <= tolerance or load <= 0:
            break
        factor = round(_next_factor(target, tried), 6)
    _, best, load = min(tried)
    return with_rates_scaled(plan, best), load


def _next_factor(target: float, tried: list[tuple[float, float, float]]) -> float:
    """The next rate factor to try after tried (miss, factor, load): the last one scaled in proportion to
    its load, unless that leaves the bracket the closest loads below and above target make; then its
    middle. The load is a step function of the rate (another rate samples other sessions), not always
    monotonic, so proportion alone can step back and forth past the target."""
    _, factor, load = tried[-1]
    proposed = factor * target / load
    below = [(miss, f) for miss, f, lo in tried if lo < target]
    above = [(miss, f) for miss, f, hi in tried if hi > target]
    if not (below and above):
        return proposed
    low, high = sorted((min(below)[1], min(above)[1]))
    return proposed if low < proposed < high else (low + high) / 2
