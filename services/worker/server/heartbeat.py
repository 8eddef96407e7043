"""The worker's heartbeat to the placer: its whole state every interval, and the placer's directives back."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

import grpc
import torch

from hanzo.inference.v1 import common_pb2, placer_pb2, placer_pb2_grpc
from services.common.internal_auth import Metadata
from services.worker.server.config import WorkerSettings
from services.worker.server.host import ModelHost, ModelKind

log = logging.getLogger(__name__)


def gpu_info(settings: WorkerSettings, host: ModelHost) -> placer_pb2.GpuInfo:
    """The device and the memory models can be loaded into: the arena's when the worker has one (the
    rest of the device is not ours to fill), else CUDA's own numbers or the host's on a CPU worker."""
    info = _device_info(settings)
    if host.memory is not None:
        info.memory_total_bytes = host.memory.arena.total_bytes
        info.memory_free_bytes = host.memory.free_bytes
    return info


def _device_info(settings: WorkerSettings) -> placer_pb2.GpuInfo:
    if settings.device.startswith("cuda"):
        device = torch.device(settings.device)
        free, total = torch.cuda.mem_get_info(device)
        return placer_pb2.GpuInfo(
            index=device.index or 0, name=torch.cuda.get_device_name(device), memory_total_bytes=total,
            memory_free_bytes=free,
        )  # fmt: skip
    page = os.sysconf("SC_PAGE_SIZE")
    return placer_pb2.GpuInfo(
        index=0, name="cpu", memory_total_bytes=os.sysconf("SC_PHYS_PAGES") * page,
        memory_free_bytes=os.sysconf("SC_AVPHYS_PAGES") * page,
    )  # fmt: skip


def node_report(
    node_id: str, address: str, settings: WorkerSettings, host: ModelHost, draining: bool
) -> placer_pb2.NodeReport:
    """Everything the placer needs about this worker, whole (heartbeats are idempotent)."""
    models = [
        placer_pb2.ModelState(name=m.name, weight_bytes=m.weight_bytes, resident=True, kind=m.kind)
        for m in host.models.values()
    ]
    # Evicted with their weights kept on the host: a load here is a bulk copy, not a disk read.
    models += [
        placer_pb2.ModelState(
            name=name, weight_bytes=copy.nbytes, resident=False, host_copy=True, kind=host.kind_of(copy)
        )
        for name, copy in host.host_copies.items()
    ]
    decoders = [m for m in host.models.values() if m.kind is ModelKind.GENERATE]
    load = placer_pb2.NodeLoad(
        running=sum(m.running for m in decoders),
        waiting=sum(m.waiting for m in decoders),
        kv_usage=max((m.kv_usage for m in decoders), default=0.0),
        max_running=settings.max_num_seqs * max(len(decoders), 1),
        batch_running=sum(m.snapshot.batch_running for m in decoders),
        batch_waiting=sum(m.snapshot.batch_waiting for m in decoders),
        latency_prompt_tokens=sum(m.snapshot.latency_prompt_tokens for m in decoders),
    )
    return placer_pb2.NodeReport(
        node_id=node_id,
        address=address,
        topology=common_pb2.Topology(zone=settings.zone, rack=settings.rack, host=settings.hostname),
        gpu=gpu_info(settings, host),
        models=models,
        load=load,
        draining=draining,
    )


class Heartbeat:
    """Beats until stopped; a placer outage only delays beats (retried every interval)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        build_report: Callable[[], placer_pb2.NodeReport],
        interval_s: float,
        host: ModelHost,
        metadata: Metadata = (),
        on_beat: Callable[[bool], None] = lambda delivered: None,
    ) -> None:
        """metadata: sent with every heartbeat (the internal token). on_beat(delivered): after each beat,
        whether the placer took it (the worker's metrics count them)."""
        self.stub = placer_pb2_grpc.PlacerStub(channel)
        self.on_beat = on_beat
        self.metadata = metadata
        self.build_report = build_report
        self.interval_s = interval_s
        self.host = host
        self.beats = 0

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                reply = await self.stub.Heartbeat(
                    self.build_report(), timeout=max(1.0, self.interval_s), metadata=self.metadata
                )
                self.beats += 1
                self.on_beat(True)
                if failures:
                    log.info("placer reachable again after %d failed heartbeats", failures)
                failures = 0
            except grpc.aio.AioRpcError as exc:
                failures += 1
                self.on_beat(False)
                if failures == 1 or failures % 30 == 0:
                    log.warning("heartbeat to the placer failed (%s): %s", exc.code().name, exc.details())
            else:
                try:
                    await self._follow(reply)
                except Exception:  # a directive that fails must not stop the heartbeats
                    log.exception("could not follow the placer's directives %s", reply)
            await asyncio.sleep(self.interval_s)

    async def _follow(self, reply: placer_pb2.HeartbeatReply) -> None:
        """Load what the placer asks for when it is in this worker's catalog; evict only idle models."""
        for name in reply.load_models:
            if name in self.host.catalog and name not in self.host.models:
                log.info("placer asks for %s here: loading", name)
                await self.host.load(name)
        for name in reply.evict_models:
            served = self.host.models.get(name)
            if served is not None and served.in_flight == 0:
                log.info("placer asks to evict idle %s", name)
                await self.host.evict(name, force=False)
