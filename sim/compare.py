"""Several policies on one trace, in parallel processes: each run is independent and seeded the same."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from sim.config import SimConfig
from sim.fleet import Cooling
from sim.sharegpt import conversations
from sim.simulation import Simulation

CONVERSATIONS = 3000  # ShareGPT conversations sampled from (their turn lengths)
# Policies by the wall time of their runs, longest first (1,000 GPUs, 30 simulated minutes): started in
# this order, the long runs do not end up last on one core while the other idles.
LONGEST_FIRST = ("prefix_load", "least_loaded", "ours", "power_of_two", "random", "round_robin")


def run_one(config: SimConfig, policy: str) -> dict[str, object]:
    """One run's summary, with its temperature trace (t, p50, p90, p99, max) under "trace"."""
    sim = Simulation(config, policy, conversations(CONVERSATIONS))
    sim.run()
    summary = sim.summary()
    summary["cooling"] = config.cooling.value
    summary["trace"] = sim.trace
    return summary


def run_policies(
    config: SimConfig, policies: list[str], jobs: int | None = None, coolings: list[Cooling] | None = None
) -> list[dict[str, object]]:
    """Every (cooling, policy) run's summary, in the order given (cooling outermost)."""
    conversations(CONVERSATIONS)  # tokenize once, before the workers read the cache
    runs = [(replace(config, cooling=c), p) for c in (coolings or [config.cooling]) for p in policies]
    jobs = jobs or min(len(runs), os.cpu_count() or 1)
    if jobs == 1:
        return [run_one(c, p) for c, p in runs]
    rank = {p: i for i, p in enumerate(LONGEST_FIRST)}
    order = sorted(range(len(runs)), key=lambda i: rank.get(runs[i][1], -1))  # an unknown one first
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {i: pool.submit(run_one, *runs[i]) for i in order}
        return [futures[i].result() for i in range(len(runs))]
