"""Streamer and load probe against real grpc.aio placer stand-ins on loopback (no gRPC mocks)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from hanzo.inference.v1 import placer_pb2, placer_pb2_grpc, telemetry_pb2
from services.telemetry.config import ProbeSettings, SimulatedGpuSettings, StreamSettings
from services.telemetry.load_probe import PlacerLoadProbe, utilization_from_load
from services.telemetry.simulated_source import SimulatedSource
from services.telemetry.streamer import TelemetryStreamer, backoff_delay_s

WAIT_S = 10.0  # generous upper bound; the waits end as soon as their condition holds
FAST = StreamSettings(interval_s=0.05, backoff_base_s=0.02, backoff_max_s=0.1, backoff_jitter=0.0)


class FakePlacer(placer_pb2_grpc.PlacerServicer):
    """Records telemetry reports and answers ListNodes with whatever load the test sets."""

    def __init__(self) -> None:
        self.reports: list[telemetry_pb2.TelemetryReport] = []
        self.list_calls = 0
        self.nodes: list[placer_pb2.NodeReport] = []
        self.changed = asyncio.Condition()

    async def StreamTelemetry(
        self,
        request_iterator: AsyncIterator[telemetry_pb2.TelemetryReport],
        context: grpc.aio.ServicerContext,
    ) -> telemetry_pb2.TelemetryAck:
        accepted = 0
        async for report in request_iterator:
            accepted += len(report.samples)
            async with self.changed:
                self.reports.append(report)
                self.changed.notify_all()
        return telemetry_pb2.TelemetryAck(samples_accepted=accepted)

    async def ListNodes(
        self, request: placer_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> placer_pb2.ListNodesReply:
        nodes = [n for n in self.nodes if not request.node_ids or n.node_id in request.node_ids]
        async with self.changed:
            self.list_calls += 1
            self.changed.notify_all()
        return placer_pb2.ListNodesReply(nodes=nodes)

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(condition), WAIT_S)


async def start_placer(port: int = 0) -> tuple[grpc.aio.Server, FakePlacer, int]:
    placer = FakePlacer()
    server = grpc.aio.server()
    placer_pb2_grpc.add_PlacerServicer_to_server(placer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, placer, bound


def simulated(load: float = 0.5) -> SimulatedSource:
    return SimulatedSource(SimulatedGpuSettings(gpu_count=2), lambda: load)


async def stop_streamer(streamer: TelemetryStreamer, task: asyncio.Task[None]) -> None:
    streamer.stop()
    await asyncio.wait_for(task, WAIT_S)


async def test_streamer_delivers_labelled_samples() -> None:
    server, placer, port = await start_placer()
    streamer = TelemetryStreamer(simulated(), "node-a", f"127.0.0.1:{port}", FAST)
    task = asyncio.create_task(streamer.run())
    try:
        await placer.wait_until(lambda: len(placer.reports) >= 3)
        report = placer.reports[0]
        assert report.node_id == "node-a"
        assert [s.gpu_index for s in report.samples] == [0, 1]
        assert {s.source for s in report.samples} == {telemetry_pb2.TELEMETRY_SOURCE_SIMULATED}
        assert report.samples[0].utilization == 0.5
    finally:
        await stop_streamer(streamer, task)
        await server.stop(None)
    assert streamer.samples_sent >= 6 and streamer.reconnects == 0


async def test_streamer_survives_a_placer_restart_on_the_same_port() -> None:
    server, first, port = await start_placer()
    streamer = TelemetryStreamer(simulated(), "node-b", f"127.0.0.1:{port}", FAST)
    task = asyncio.create_task(streamer.run())
    try:
        await first.wait_until(lambda: len(first.reports) >= 2)
        await server.stop(None)
        sent_before_restart = streamer.samples_sent
        # Let it fail against the closed port for a few backoff rounds before the placer returns.
        server = None
        await asyncio.sleep(0.2)
        assert not task.done()
        server, second, _ = await start_placer(port)
        await second.wait_until(lambda: len(second.reports) >= 2)
        assert second.reports[0].node_id == "node-b"
        assert streamer.reconnects >= 1
        assert streamer.samples_sent > sent_before_restart
    finally:
        await stop_streamer(streamer, task)
        if server is not None:
            await server.stop(None)


async def test_streamer_starts_before_the_placer_and_stops_while_backing_off() -> None:
    server, _, port = await start_placer()
    await server.stop(None)  # a port that refuses connections
    streamer = TelemetryStreamer(simulated(), "node-c", f"127.0.0.1:{port}", FAST)
    task = asyncio.create_task(streamer.run())
    server, placer, _ = await start_placer(port)
    try:
        await placer.wait_until(lambda: len(placer.reports) >= 1)
    finally:
        await stop_streamer(streamer, task)
        await server.stop(None)
    # Stopping half-closes the call: the placer's handler ends normally with its ack.
    assert task.exception() is None


async def test_stop_while_placer_unreachable_returns_promptly() -> None:
    server, _, port = await start_placer()
    await server.stop(None)
    slow = StreamSettings(interval_s=0.05, backoff_base_s=30.0, backoff_max_s=30.0)
    streamer = TelemetryStreamer(simulated(), "node-d", f"127.0.0.1:{port}", slow)
    task = asyncio.create_task(streamer.run())
    await asyncio.sleep(0.1)  # let the first attempt fail; it is now in a 30 s backoff
    await stop_streamer(streamer, task)
    assert streamer.samples_sent == 0


@pytest.mark.parametrize(
    ("failures", "delay_s"),
    [(0, 0.5), (1, 1.0), (3, 4.0), (6, 30.0), (1000, 30.0)],
)
def test_backoff_doubles_up_to_the_cap(failures: int, delay_s: float) -> None:
    settings = StreamSettings(backoff_base_s=0.5, backoff_max_s=30.0, backoff_jitter=0.0)
    assert backoff_delay_s(settings, failures, random.Random(0)) == delay_s


def test_backoff_jitter_only_shortens() -> None:
    settings = StreamSettings(backoff_base_s=1.0, backoff_max_s=1.0, backoff_jitter=0.5)
    rng = random.Random(0)
    delays = [backoff_delay_s(settings, 0, rng) for _ in range(200)]
    assert all(0.5 <= d <= 1.0 for d in delays) and len(set(delays)) > 1


def node(node_id: str, running: int, max_running: int, waiting: int = 0) -> placer_pb2.NodeReport:
    load = placer_pb2.NodeLoad(running=running, waiting=waiting, max_running=max_running, kv_usage=0.5)
    return placer_pb2.NodeReport(node_id=node_id, load=load)


@pytest.mark.parametrize(
    ("running", "max_running", "waiting", "expected"),
    [
        (0, 8, 0, 0.1),  # idle worker: the floor
        (4, 8, 0, 0.55),
        (8, 8, 5, 1.0),  # full; the queue adds nothing
        (20, 8, 0, 1.0),  # clamped
        (3, 0, 0, 1.0),  # unknown capacity counts as 1
    ],
)
def test_utilization_formula(running: int, max_running: int, waiting: int, expected: float) -> None:
    load = node("n", running, max_running, waiting).load
    assert utilization_from_load(load, idle_utilization=0.1) == pytest.approx(expected)


async def test_load_probe_follows_the_placer() -> None:
    server, placer, port = await start_placer()
    placer.nodes = [node("other", 8, 8), node("node-p", 2, 8)]
    probe = PlacerLoadProbe(
        "node-p", f"127.0.0.1:{port}", ProbeSettings(interval_s=0.02, idle_utilization=0.0)
    )
    assert probe.utilization() == 0.0  # nothing known yet
    task = asyncio.create_task(probe.run())
    try:
        await placer.wait_until(lambda: placer.list_calls >= 1)
        await placer.wait_until(lambda: probe.utilization() == 0.25)
        placer.nodes = [node("node-p", 6, 8)]
        # Each poll applies its answer before the next one starts, so two polls after the change
        # have certainly been applied.
        seen = placer.list_calls
        await placer.wait_until(lambda: placer.list_calls >= seen + 2)
        assert probe.utilization() == 0.75
        placer.nodes = []  # the placer forgot the node: no known work
        seen = placer.list_calls
        await placer.wait_until(lambda: placer.list_calls >= seen + 2)
        assert probe.utilization() == 0.0
    finally:
        probe.stop()
        await asyncio.wait_for(task, WAIT_S)
        await server.stop(None)


async def test_load_probe_keeps_its_value_while_the_placer_is_down() -> None:
    server, placer, port = await start_placer()
    placer.nodes = [node("node-q", 8, 8)]
    probe = PlacerLoadProbe("node-q", f"127.0.0.1:{port}", ProbeSettings(timeout_s=0.5))
    try:
        await probe.refresh_once()
        assert probe.utilization() == 1.0
        await server.stop(None)
        await probe.refresh_once()  # fails: UNAVAILABLE
        assert probe.utilization() == 1.0
    finally:
        await probe.close()


async def test_simulated_source_driven_by_the_probe_heats_up() -> None:
    server, placer, port = await start_placer()
    placer.nodes = [node("node-h", 8, 8)]
    probe = PlacerLoadProbe("node-h", f"127.0.0.1:{port}", ProbeSettings())
    clock = [0.0]
    source = SimulatedSource(
        SimulatedGpuSettings(time_constant_s=10.0), probe.utilization, clock=lambda: clock[0]
    )
    try:
        await probe.refresh_once()
        clock[0] = 100.0
        (reading,) = source.read()
        assert reading.utilization == 1.0 and reading.temperature_c == pytest.approx(88.0, abs=0.01)
    finally:
        await probe.close()
        await server.stop(None)
