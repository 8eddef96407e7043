"""Telemetry load for bench/placer.py: new GPU samples for random workers, written through
ClusterStore.write_thermal (SET + PUBLISH, as a placer does on StreamTelemetry) at a fixed rate, so every
subscribed placer applies that many pub/sub events per second. Runs in its own process so that it does not
share the measuring core. Prints "TELEMETRY_READY" once writing; on SIGTERM/SIGINT prints one JSON line
{"samples": N, "skipped": K, "seconds": S, "samples_per_s": R} and exits.

    HANZO_BENCH_REDIS_URL=URL .venv/bin/python bench/placer_telemetry_load.py [--rate 2000] [--nodes 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench.placer_cluster import ClusterShape, gpu_sample
from bench.placer_procs import REDIS_URL_ENV
from hanzo.inference.v1 import cluster_state_pb2
from services.placer.cluster.schema import Keys
from services.placer.cluster.store import ClusterStore
from services.placer.pick import nvml_bits

TICK_S = 0.005  # writes due are issued every tick, concurrently, so the rate holds without a busy loop
MAX_IN_FLIGHT = 32
MAX_LAG_S = 0.05  # a backlog longer than this is dropped (and counted), not caught up
TREND_ALPHA = 0.3  # as services/placer/cluster/view.py smooths the temperature trend


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Default from the environment: the URL carries the password, which a command line would show.
    parser.add_argument(
        "--redis-url", default=os.environ.get(REDIS_URL_ENV), help=f"default: ${REDIS_URL_ENV}"
    )
    parser.add_argument("--key-prefix", default="hanzo")
    parser.add_argument("--rate", type=float, default=2000.0, help="samples per second")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--ttl-s", type=float, default=3600.0, help="TTL of each thermal key")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not args.redis_url:
        parser.error(f"give --redis-url or set {REDIS_URL_ENV}")
    return args


async def run(args: argparse.Namespace) -> dict[str, float]:
    """Write samples until SIGTERM/SIGINT; returns what was achieved."""
    shape = ClusterShape(args.nodes, args.gpus)
    rng = np.random.default_rng(args.seed)
    store = ClusterStore(args.redis_url, Keys(args.key_prefix))
    previous: dict[int, cluster_state_pb2.ThermalEntry] = {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def next_entry(worker: int) -> cluster_state_pb2.ThermalEntry:
        entry = cluster_state_pb2.ThermalEntry(sample=gpu_sample(rng, worker % shape.gpus_per_node))
        last = previous.get(worker)
        sample = entry.sample
        if last is not None and not sample.clock_event_reasons & nvml_bits.THERMAL_SLOWDOWN:
            # Temperatures drift (a random walk from the last sample) rather than jump.
            walked = last.sample.temperature_c + rng.normal(0.0, 1.0)
            sample.temperature_c = float(np.clip(walked, 30.0, sample.slowdown_temperature_c - 1.0))
        if last is not None:
            dt = entry.sample.timestamp_s - last.sample.timestamp_s
            rate = (entry.sample.temperature_c - last.sample.temperature_c) / dt if dt > 0 else 0.0
            trend = last.temperature_trend_c_per_s
            entry.temperature_trend_c_per_s = trend + TREND_ALPHA * (rate - trend)
        previous[worker] = entry
        return entry

    async def write(worker: int) -> None:
        await store.write_thermal(shape.worker_id(worker), next_entry(worker), args.ttl_s)

    pending: set[asyncio.Task[None]] = set()
    issued = written = skipped = 0
    print("TELEMETRY_READY", flush=True)
    start = time.perf_counter()
    try:
        while not stop.is_set():
            for task in [t for t in pending if t.done()]:
                pending.discard(task)
                task.result()  # a failed write ends the run loudly
                written += 1
            target = int((time.perf_counter() - start) * args.rate)
            if target - issued > args.rate * MAX_LAG_S:
                skipped += target - issued  # fell behind: a steady rate, not a catch-up burst
                issued = target
            # At most MAX_IN_FLIGHT at once: redis-py's asyncio pool refuses its 101st connection.
            due = min(target - issued, MAX_IN_FLIGHT - len(pending))
            if due > 0:
                for w in rng.integers(shape.workers, size=due).tolist():
                    pending.add(asyncio.create_task(write(w)))
                issued += due
            await asyncio.sleep(TICK_S)
        await asyncio.gather(*pending)
        written += len(pending)
    finally:
        seconds = time.perf_counter() - start
        await store.close()
    achieved = round(written / seconds, 1)
    return {"samples": written, "skipped": skipped, "seconds": round(seconds, 3), "samples_per_s": achieved}


def main() -> None:
    print(json.dumps(asyncio.run(run(parse_args()))), flush=True)


if __name__ == "__main__":
    main()
