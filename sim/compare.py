"""Several policies on one trace, in parallel processes: each run is independent and seeded the same."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from sim.fleet import Cooling
from sim.sharegpt import conversations
from sim.simulation import SimConfig, Simulation

CONVERSATIONS = 3000  # ShareGPT conversations sampled from (their turn lengths)


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
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_one, *zip(*runs, strict=True)))
