"""Timed loops of bench/placer.py: registration over gRPC, in-process picks, naive picks, gRPC picks.

Latencies are per call (perf_counter_ns around the call only); throughputs are calls over wall time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hanzo.inference.v1 import placer_pb2, placer_pb2_grpc, telemetry_pb2
from services.gateway.placer_link import PlacerLink


@dataclass(frozen=True)
class Timed:
    """Per-call latencies in microseconds and calls per second of wall time."""

    latencies_us: np.ndarray
    wall_s: float

    @property
    def calls(self) -> int:
        return int(self.latencies_us.size)

    @property
    def per_s(self) -> float:
        return self.calls / self.wall_s

    def percentile_us(self, q: float) -> float:
        return float(np.percentile(self.latencies_us, q))


async def register(
    stub: placer_pb2_grpc.PlacerStub, reports: Sequence[placer_pb2.NodeReport], in_flight: int
) -> float:
    """Heartbeat every report, in_flight at a time; seconds taken."""
    start = time.perf_counter()
    queue = iter(reports)

    async def worker() -> None:
        for report in queue:
            await stub.Heartbeat(report, timeout=30)

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return time.perf_counter() - start


async def stream_samples(
    stub: placer_pb2_grpc.PlacerStub,
    node_ids: Sequence[str],
    samples: Sequence[telemetry_pb2.GpuSample],
    per_stream: int,
    in_flight: int,
) -> float:
    """StreamTelemetry one sample per worker, per_stream workers per stream (one telemetry agent per
    host), in_flight streams at a time; seconds taken. RuntimeError if the placer accepted fewer."""
    start = time.perf_counter()
    chunks = iter(range(0, len(node_ids), per_stream))

    async def worker() -> int:
        accepted = 0
        for first in chunks:
            reports = [
                telemetry_pb2.TelemetryReport(node_id=node_ids[i], samples=[samples[i]])
                for i in range(first, min(first + per_stream, len(node_ids)))
            ]
            ack = await stub.StreamTelemetry(iter(reports), timeout=60)
            accepted += ack.samples_accepted
        return accepted

    accepted = sum(await asyncio.gather(*(worker() for _ in range(in_flight))))
    if accepted != len(node_ids):
        raise RuntimeError(f"placer accepted {accepted} of {len(node_ids)} samples")
    return time.perf_counter() - start


async def inprocess_picks(
    pick: Callable[[placer_pb2.PickRequest], object],
    requests: Sequence[placer_pb2.PickRequest],
    duration_s: float,
    burst_s: float,
) -> Timed:
    """Synchronous picks in bursts of about burst_s, each followed by `await asyncio.sleep(0)` so the
    event loop applies pub/sub events and runs the placer's loops between bursts (as between requests)."""
    latencies: list[int] = []
    i = 0
    start = time.perf_counter_ns()
    end = start + int(duration_s * 1e9)
    burst_ns = int(burst_s * 1e9)
    now = start
    while now < end:
        burst_end = now + burst_ns
        while now < burst_end:
            t0 = time.perf_counter_ns()
            pick(requests[i % len(requests)])
            now = time.perf_counter_ns()
            latencies.append(now - t0)
            i += 1
        await asyncio.sleep(0)
        now = time.perf_counter_ns()
    return Timed(np.array(latencies) / 1e3, (now - start) / 1e9)


async def serial_calls(
    call: Callable[[placer_pb2.PickRequest], Awaitable[object]],
    requests: Sequence[placer_pb2.PickRequest],
    count: int,
) -> Timed:
    """count awaited calls, one in flight at a time."""
    latencies = []
    start = time.perf_counter_ns()
    for i in range(count):
        t0 = time.perf_counter_ns()
        await call(requests[i % len(requests)])
        latencies.append(time.perf_counter_ns() - t0)
    return Timed(np.array(latencies) / 1e3, (time.perf_counter_ns() - start) / 1e9)


async def concurrent_calls(
    call: Callable[[placer_pb2.PickRequest], Awaitable[object]],
    requests: Sequence[placer_pb2.PickRequest],
    in_flight: int,
    duration_s: float,
) -> Timed:
    """Calls from in_flight concurrent loops for duration_s (each loop finishes its last call)."""
    latencies: list[int] = []
    start = time.perf_counter_ns()
    end = start + int(duration_s * 1e9)

    async def loop(offset: int) -> None:
        i = offset
        while time.perf_counter_ns() < end:
            t0 = time.perf_counter_ns()
            await call(requests[i % len(requests)])
            latencies.append(time.perf_counter_ns() - t0)
            i += in_flight

    await asyncio.gather(*(loop(k) for k in range(in_flight)))
    return Timed(np.array(latencies) / 1e3, (time.perf_counter_ns() - start) / 1e9)


async def streamed_calls(
    stub: placer_pb2_grpc.PlacerStub,
    requests: Sequence[placer_pb2.PickRequest],
    in_flight: int,
    duration_s: float,
) -> Timed:
    """concurrent_calls through one PickStream call, as a remote gateway picks (its PlacerLink), after
    300 serial picks to warm the call up."""
    link = PlacerLink(stub)
    try:

        def pick(request: placer_pb2.PickRequest) -> Awaitable[placer_pb2.PickReply]:
            return link.pick(request, 10.0, {})

        await serial_calls(pick, requests, 300)
        return await concurrent_calls(pick, requests, in_flight, duration_s)
    finally:
        await link.close()
