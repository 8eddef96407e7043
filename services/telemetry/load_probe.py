"""The simulated source's load input: this node's load as the placer last saw it, cached for read()."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from hanzo.inference.v1 import placer_pb2, placer_pb2_grpc
from services.common.channels import internal_channel
from services.common.internal_auth import call_metadata
from services.telemetry.config import ProbeSettings

logger = logging.getLogger(__name__)


def utilization_from_load(load: placer_pb2.NodeLoad, idle_utilization: float) -> float:
    """Busy fraction in [0, 1] from a worker's reported load.

    u = idle + (1 - idle) * min(1, running / max(max_running, 1)). Occupied sequence slots are the
    proxy for how busy the GPU is; `idle` (0.1 by default) stands for the small constant work of a
    worker that holds models but serves nothing. Queued requests add nothing: they do not run yet.
    """
    busy = min(1.0, load.running / max(load.max_running, 1))
    return idle_utilization + (1.0 - idle_utilization) * busy


class PlacerLoadProbe:
    """Polls the placer's ListNodes for one node; utilization() returns the cached value and never blocks.

    Until the first answer, and while the placer does not know the node, the value is 0.0 (no known
    work). When the placer is unreachable the last value is kept: the worker is probably still busy.
    """

    def __init__(
        self, node_id: str, placer_address: str, settings: ProbeSettings, internal_token: str | None = None
    ) -> None:
        self._metadata = call_metadata(internal_token)
        self._node_id = node_id
        self._settings = settings
        # Reconnects capped at one interval: the probe sees a restarted placer on its next poll instead
        # of failing fast for minutes.
        self._channel = internal_channel(placer_address, reconnect_backoff_s=settings.interval_s)
        self._stub = placer_pb2_grpc.PlacerStub(self._channel)
        self._value = 0.0
        self._stop = asyncio.Event()

    def utilization(self) -> float:
        """The latest busy fraction in [0, 1]. Safe to call from any thread (a float read)."""
        return self._value

    async def refresh_once(self) -> None:
        """Ask the placer once and update the cached value; a failed call keeps the old one."""
        request = placer_pb2.ListNodesRequest(node_ids=[self._node_id])
        try:
            reply = await self._stub.ListNodes(
                request, timeout=self._settings.timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as err:
            logger.debug(
                "ListNodes for %s failed (%s); keeping load %.2f", self._node_id, err.code(), self._value
            )
            return
        node = next((n for n in reply.nodes if n.node_id == self._node_id), None)
        if node is None:
            self._value = 0.0
        else:
            self._value = utilization_from_load(node.load, self._settings.idle_utilization)

    async def run(self) -> None:
        """Refresh every settings.interval_s until stop(); then close the channel."""
        try:
            while not self._stop.is_set():
                await self.refresh_once()
                with contextlib.suppress(TimeoutError):  # the interval passed: poll again
                    await asyncio.wait_for(self._stop.wait(), timeout=self._settings.interval_s)
        finally:
            await self._channel.close()

    def stop(self) -> None:
        """Ask run() to return; it does so within one ListNodes timeout."""
        self._stop.set()

    async def close(self) -> None:
        """Close the channel without run() (for callers that only use refresh_once)."""
        await self._channel.close()
