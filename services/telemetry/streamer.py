"""Streams a node's GPU readings to the placer on one client-streaming call, reconnecting with backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

import grpc

from hanzo.inference.v1 import placer_pb2_grpc, telemetry_pb2
from services.common.internal_auth import call_metadata
from services.telemetry.config import StreamSettings
from services.telemetry.sample import GpuReading
from services.telemetry.sources import GpuSource

logger = logging.getLogger(__name__)


def backoff_delay_s(settings: StreamSettings, failures: int, rng: random.Random) -> float:
    """Seconds to wait before reconnect attempt `failures` (0 after a stream that delivered)."""
    # 2**failures overflows float for very long outages; the cap applies long before that.
    delay = settings.backoff_max_s if failures > 60 else settings.backoff_base_s * 2.0**failures
    delay = min(settings.backoff_max_s, delay)
    return delay * (1.0 - settings.backoff_jitter * rng.random())


class TelemetryStreamer:
    """Every interval_s reads the source (in a thread: NVML blocks) and writes one TelemetryReport.

    Any stream failure (placer restart, network loss, the placer ending the call) leads to a fresh
    channel and call after a backoff; run() only returns after stop(). Delivery is best effort: a
    report written just before the connection drops is lost, and the next one supersedes it anyway.
    Counters, for tests and logs: samples_sent and reports_sent (handed to the transport), reconnects
    (stream openings after the first).
    """

    def __init__(
        self,
        source: GpuSource,
        node_id: str,
        placer_address: str,
        settings: StreamSettings,
        *,
        rng: random.Random | None = None,
        internal_token: str | None = None,
    ) -> None:
        self._metadata = call_metadata(internal_token)
        self._source = source
        self._node_id = node_id
        self._address = placer_address
        self._settings = settings
        self._rng = rng or random.Random()
        self._stop = asyncio.Event()
        self.samples_sent = 0
        self.reports_sent = 0
        self.reconnects = 0

    def stop(self) -> None:
        """Ask run() to half-close the stream, take the placer's ack, and return."""
        self._stop.set()

    async def run(self) -> None:
        """Stream until stop(); never raises for connection trouble."""
        failures = 0
        opened = False
        while not self._stop.is_set():
            if opened:
                self.reconnects += 1
            opened = True
            delivered = await self._stream_once()
            failures = 0 if delivered else failures + 1
            if not self._stop.is_set():
                await self._sleep(backoff_delay_s(self._settings, failures, self._rng))

    async def _stream_once(self) -> bool:
        """One channel and call, until it fails or stop(). True when at least one report went out."""
        delivered = False
        channel = grpc.aio.insecure_channel(self._address)
        call = placer_pb2_grpc.PlacerStub(channel).StreamTelemetry(metadata=self._metadata)
        loop = asyncio.get_running_loop()
        try:
            next_tick = loop.time()
            while not self._stop.is_set():
                readings = await self._read()
                if readings:
                    await call.write(self._report(readings))
                    self.samples_sent += len(readings)
                    self.reports_sent += 1
                    if not delivered:
                        logger.info("streaming telemetry to %s", self._address)
                    delivered = True
                # Fixed-rate ticks; after a stall, skip the missed ones instead of bursting.
                next_tick = max(next_tick + self._settings.interval_s, loop.time())
                await self._sleep(next_tick - loop.time())
            await call.done_writing()
            ack = await asyncio.wait_for(call, timeout=self._settings.interval_s)
            logger.info("telemetry stream closed; placer accepted %d samples", ack.samples_accepted)
        except (grpc.RpcError, asyncio.InvalidStateError, TimeoutError) as err:
            # InvalidStateError: the placer ended the call between writes; its status says why.
            reason = (await call.code()).name if call.done() else type(err).__name__
            # Warn when a working stream breaks or the very first attempt fails; the retries of one
            # outage stay at debug so a long placer outage does not flood the log.
            log = logger.warning if delivered or self.reconnects == 0 else logger.debug
            then = "stopping" if self._stop.is_set() else "reconnecting with backoff"
            log("telemetry stream to %s lost (%s); %s", self._address, reason, then)
        finally:
            call.cancel()
            await channel.close()
        return delivered

    async def _read(self) -> list[GpuReading]:
        try:
            return await asyncio.to_thread(self._source.read)
        except Exception:
            # A GPU fallen off the bus or a driver hiccup must not end the agent: skip this tick.
            logger.exception("reading GPU telemetry failed; skipping this sample")
            return []

    def _report(self, readings: list[GpuReading]) -> telemetry_pb2.TelemetryReport:
        return telemetry_pb2.TelemetryReport(node_id=self._node_id, samples=[r.to_proto() for r in readings])

    async def _sleep(self, seconds: float) -> None:
        """Sleep that stop() cuts short."""
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
