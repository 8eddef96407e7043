"""Whole runs on a small fleet: deterministic, fed through the placer's own state, every policy."""

from __future__ import annotations

import gc

import pytest

from sim.config import SimConfig, WorkloadConfig
from sim.fleet import Cooling, FleetLayout
from sim.policies import EXPERIMENTS, POLICIES
from sim.sharegpt import conversations
from sim.simulation import Simulation

# 32 GPUs, two racks per zone, every GPU serving every model (so no request is refused for its model).
LAYOUT = FleetLayout(hosts=4, hosts_per_rack=2, model_sets=((("llama-70b", "llama-8b", "minilm"), 1.0),))
WORKLOAD = WorkloadConfig(duration_s=60.0)


@pytest.fixture(scope="module")
def turns() -> list:
    return conversations(300)


def run(policy: str, turns: list, cooling: Cooling = Cooling.SEVERE, seed: int = 0) -> Simulation:
    sim = Simulation(SimConfig(LAYOUT, WORKLOAD, cooling=cooling, seed=seed), policy, turns)
    sim.run()
    return sim


def _stable(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in ("wall_s", "pick_us_mean")}


def test_a_run_is_deterministic_in_its_seed(turns: list) -> None:
    first, again, other = run("ours", turns), run("ours", turns), run("ours", turns, seed=1)
    assert _stable(first.summary()) == _stable(again.summary())
    assert _stable(first.summary()) != _stable(other.summary())


@pytest.mark.parametrize("policy", sorted([*POLICIES, *EXPERIMENTS]))
def test_every_policy_serves_every_class(policy: str, turns: list) -> None:
    summary = run(policy, turns).summary()
    for name, figures in summary["classes"].items():  # type: ignore[union-attr]
        assert figures["completed"] > 0, name
        assert figures["rejected"] == 0, name
    assert summary["picks"] > 1000


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_leaves_the_garbage_collector_as_it_found_it(turns: list, enabled: bool) -> None:
    """Collections are off during a run (Simulation.run says why) and back as they were after it."""
    seen: list[bool] = []
    sim = Simulation(SimConfig(LAYOUT, WorkloadConfig(duration_s=5.0)), "random", turns)
    choose = sim.choose
    sim.choose = lambda state, query: seen.append(gc.isenabled()) or choose(state, query)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        sim.run()
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen and not any(seen)


def test_the_placer_state_holds_every_gpu_with_its_load_and_thermal_trend(turns: list) -> None:
    sim = run("ours", turns)
    state = sim.state
    assert len(state.nodes) == LAYOUT.gpus and len(state.thermal) == LAYOUT.gpus
    snapshot = state.snapshot
    assert snapshot.has_thermal[: snapshot.num_rows].all()
    assert (snapshot.temperature_trend_c_per_s[: snapshot.num_rows] > 0).any()  # warming from idle
    assert snapshot.running[: snapshot.num_rows].sum() > 0
    host_of = {node_id: sim.fleet.host_labels[g] for g, node_id in enumerate(sim.fleet.node_ids)}
    assert all(entry.report.topology.host == host_of[n] for n, entry in state.nodes.items())


def test_the_same_sessions_arrive_under_every_policy(turns: list) -> None:
    """Only follow-up turns depend on how fast answers came; first requests are the trace itself."""
    firsts = {}
    for policy in ("random", "ours"):
        sim = Simulation(SimConfig(LAYOUT, WORKLOAD), policy, turns)
        firsts[policy] = [(r.workload, r.arrival_s, r.prompt, r.output) for r in sim.workload.arrivals()]
    assert firsts["random"] == firsts["ours"] and len(firsts["ours"]) > 500
