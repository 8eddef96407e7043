"""Helpers for placer tests: node reports, a polling wait with a deadline, gRPC stubs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import grpc

from hanzo.inference.v1 import common_pb2, placer_pb2, placer_pb2_grpc, telemetry_pb2

GIB = 1024**3


def node_report(
    node_id: str,
    *,
    models: tuple[str, ...] = ("llama-tiny",),
    catalog: tuple[str, ...] = (),
    zone: str = "z1",
    rack: str = "r1",
    host: str | None = None,
    running: int = 0,
    waiting: int = 0,
    kv_usage: float = 0.0,
    free_gib: float = 40.0,
) -> placer_pb2.NodeReport:
    return placer_pb2.NodeReport(
        node_id=node_id,
        address=f"127.0.0.1:{50000 + hash(node_id) % 1000}",
        topology=common_pb2.Topology(zone=zone, rack=rack, host=host or f"host-{node_id}"),
        gpu=placer_pb2.GpuInfo(
            index=0, name="H200", memory_total_bytes=141 * GIB, memory_free_bytes=int(free_gib * GIB)
        ),
        models=[placer_pb2.ModelState(name=m, weight_bytes=2 * GIB, resident=True) for m in models]
        + [placer_pb2.ModelState(name=m, weight_bytes=2 * GIB, resident=False) for m in catalog],
        load=placer_pb2.NodeLoad(running=running, waiting=waiting, kv_usage=kv_usage, max_running=64),
    )


def gpu_sample(
    temperature_c: float, *, reasons: int = 0, timestamp_s: float | None = None
) -> telemetry_pb2.GpuSample:
    return telemetry_pb2.GpuSample(
        gpu_index=0,
        timestamp_s=time.time() if timestamp_s is None else timestamp_s,
        source=telemetry_pb2.TELEMETRY_SOURCE_SIMULATED,
        temperature_c=temperature_c,
        slowdown_temperature_c=87.0,
        shutdown_temperature_c=95.0,
        clock_event_reasons=reasons,
        power_w=300.0,
        power_limit_w=700.0,
        sm_clock_mhz=1980.0,
        sm_clock_max_mhz=1980.0,
        utilization=0.5,
    )


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    """Poll check until it holds; returns the seconds it took; fails the test after timeout_s."""
    start = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s:.1f} s: {what}")
        await asyncio.sleep(0.02)


def placer_stub(address: str) -> tuple[grpc.aio.Channel, placer_pb2_grpc.PlacerStub]:
    channel = grpc.aio.insecure_channel(address)
    return channel, placer_pb2_grpc.PlacerStub(channel)
