"""The worker process: models, the Worker gRPC server, heartbeats to the placer, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from opentelemetry.trace import TracerProvider
from prometheus_client import start_http_server

from hanzo.inference.v1 import placer_pb2, worker_pb2, worker_pb2_grpc
from services.common.channels import internal_channel
from services.common.errors import ResourceExhausted
from services.common.grpc_metrics import GrpcServerMetrics
from services.common.grpc_server import add_health_and_reflection, bind, new_server, set_serving
from services.common.internal_auth import call_metadata, server_check
from services.common.served import serve_instrumented
from services.common.tasks import cancel_and_wait
from services.common.tracing import make_tracer_provider, shutdown_tracing
from services.worker.models.errors import CheckpointError
from services.worker.server.config import WorkerSettings
from services.worker.server.error_status import worker_status
from services.worker.server.heartbeat import Heartbeat, node_report
from services.worker.server.host import ModelHost
from services.worker.server.metrics import WorkerMetrics
from services.worker.server.servicer import WorkerServicer

log = logging.getLogger(__name__)

SERVICE = worker_pb2.DESCRIPTOR.services_by_name["Worker"]
SERVICE_NAME = SERVICE.full_name


class WorkerApp:
    """`await start()` loads every catalog model, serves, and heartbeats; `await stop()` drains."""

    def __init__(self, settings: WorkerSettings, tracer_provider: TracerProvider | None = None) -> None:
        self.settings = settings
        self.tracer_provider = tracer_provider or make_tracer_provider("hanzo-worker")
        self.metrics = WorkerMetrics()
        self.host = ModelHost(settings)
        self.server = new_server()
        self.address = bind(self.server, settings.host, settings.port)
        self.node_id = settings.node_id or f"{settings.hostname}-{self.address.rsplit(':', 1)[1]}"
        self.advertise_address = settings.advertise_address or self.address
        tracer = self.tracer_provider.get_tracer("hanzo.worker")
        check = server_check(settings.internal_token, "worker")
        self.servicer = WorkerServicer(self.node_id, self.host, self.metrics, tracer, check)
        serve_instrumented(
            self.servicer,
            SERVICE,
            tracer,
            check,
            unwrapped=frozenset({"GenerateStreams"}),
            status_of=worker_status,
            metrics=GrpcServerMetrics(self.metrics.registry),
        )
        worker_pb2_grpc.add_WorkerServicer_to_server(self.servicer, self.server)
        self.health = add_health_and_reflection(self.server, [SERVICE_NAME])
        self.metrics_port: int | None = None
        self._placer_channel: grpc.aio.Channel | None = None
        self.heartbeat: Heartbeat | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._serving = False  # what health says, kept in step with `serving`

    async def start(self) -> None:
        for name in self.settings.models:
            try:
                # In catalog order while they fit: a later model never evicts an earlier one at start.
                await self.host.load(name, make_room=False)
            except (CheckpointError, ResourceExhausted) as exc:
                # The rest of the catalog still serves; this one can be loaded later (LoadModel, placer).
                log.error("not serving %s from the start: %s", name, exc)
        await self.server.start()
        self._serving = self.serving
        if not self._serving:
            log.error(
                "no model of the catalog (%s) could be loaded: health NOT_SERVING, and the placer is told "
                "to offer this worker nothing until a model loads (LoadModel)",
                ", ".join(self.settings.models),
            )
        await set_serving(self.health, ["", SERVICE_NAME], self._serving)
        if self.settings.metrics_port is not None:
            http_server, _ = start_http_server(self.settings.metrics_port, registry=self.metrics.registry)
            self.metrics_port = http_server.server_port
        # Reconnects capped at one heartbeat interval: a restarted placer hears from this worker on its
        # next beat instead of minutes later.
        self._placer_channel = internal_channel(
            self.settings.placer_address, reconnect_backoff_s=self.settings.heartbeat_interval_s
        )
        self.heartbeat = Heartbeat(
            self._placer_channel,
            self._report,
            self.settings.heartbeat_interval_s,
            self.host,
            call_metadata(self.settings.internal_token),
            self.metrics.heartbeat,
        )
        self._tasks = [
            asyncio.create_task(self.heartbeat.run(), name="heartbeat"),
            asyncio.create_task(self._gauges(), name="gauges"),
        ]
        if self.settings.kv_rebalance_interval_s > 0 and self.host.memory is not None:
            self._tasks.append(asyncio.create_task(self._rebalance_kv(), name="kv-rebalance"))
        log.info("worker %s serving %s on %s", self.node_id, sorted(self.host.models), self.address)

    async def stop(self) -> None:
        """Drain: health NOT_SERVING and a draining heartbeat (the placer stops sending work), in-flight
        streams get drain_timeout_s to finish, then models and connections close."""
        self.servicer.drain()
        await set_serving(self.health, ["", SERVICE_NAME], False)
        if self.heartbeat is not None:
            with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
                goodbye = self.heartbeat.stub.Heartbeat(
                    self._report(), timeout=1.0, metadata=self.heartbeat.metadata
                )
                await asyncio.wait_for(goodbye, 1.5)
        await self.server.stop(self.settings.drain_timeout_s)
        await cancel_and_wait(self._tasks)
        self._tasks = []  # a cancelled task's traceback holds its frame, and so this app
        await self.host.close()
        if self._placer_channel is not None:
            await self._placer_channel.close()
        shutdown_tracing(self.tracer_provider)

    @property
    def serving(self) -> bool:
        """False while a worker given models has none resident: every request would fail here."""
        return bool(self.host.models) or not self.settings.models

    def _report(self) -> placer_pb2.NodeReport:
        # A worker serving nothing reports itself draining: the placer offers draining nodes nothing.
        draining = self.servicer.draining or not self.serving
        return node_report(self.node_id, self.advertise_address, self.settings, self.host, draining)

    async def _rebalance_kv(self) -> None:
        """KV repartitioning between resident decoders, every kv_rebalance_interval_s."""
        while True:
            await asyncio.sleep(self.settings.kv_rebalance_interval_s)
            try:
                await self.host.rebalance_kv()
            except Exception:  # a failed move must not stop the loop; the engines serve as before
                log.exception("KV rebalancing failed")

    async def _gauges(self) -> None:
        """Refresh the engine-state metrics (cheap reads), and health once a model loads, once a second."""
        while True:
            self.metrics.refresh(list(self.host.models.values()))
            self.metrics.refresh_memory(self.host)
            if self.serving != self._serving and not self.servicer.draining:
                self._serving = self.serving
                await set_serving(self.health, ["", SERVICE_NAME], self._serving)
            await asyncio.sleep(1.0)
