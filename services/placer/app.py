"""The placer process: Redis-backed cluster view, picker, replica planner and the gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from opentelemetry.trace import TracerProvider
from prometheus_client import start_http_server

from hanzo.inference.v1 import placer_pb2, placer_pb2_grpc
from services.common.grpc_metrics import GrpcServerMetrics
from services.common.grpc_server import add_health_and_reflection, bind, new_server, set_serving
from services.common.internal_auth import server_check
from services.common.redact import redact_url
from services.common.served import serve_instrumented
from services.common.tasks import cancel_and_wait
from services.common.tracing import make_tracer_provider, shutdown_tracing
from services.placer.config import PlacerSettings
from services.placer.demand import demand_rates
from services.placer.gpu_metrics import FleetGpuCollector
from services.placer.metrics import PlacerMetrics
from services.placer.pick.scorers import ScorerConfig
from services.placer.placement import plan_replicas
from services.placer.replica import PlacerReplica
from services.placer.servicer import PlacerServicer

log = logging.getLogger(__name__)

SERVICE = placer_pb2.DESCRIPTOR.services_by_name["Placer"]
SERVICE_NAME = SERVICE.full_name
# Named health check that is NOT_SERVING while the snapshot is stale (Redis unreachable).
FRESHNESS_CHECK = "hanzo.placer.ClusterState"


class PlacerApp:
    """Start with `await app.start()`, stop with `await app.stop()`; `address` is the bound host:port."""

    def __init__(self, settings: PlacerSettings, tracer_provider: TracerProvider | None = None) -> None:
        self.settings = settings
        self.tracer_provider = tracer_provider or make_tracer_provider("hanzo-placer")
        self.instance_id = uuid.uuid4().hex[:12]
        self.metrics = PlacerMetrics()
        self.replica = PlacerReplica(
            settings.redis_url,
            settings.key_prefix,
            settings.resync_interval_s,
            settings.class_weights,
            self.metrics,
            settings.prefix_capacity,
            settings.prefix_balance,
            ScorerConfig(node_reserve_fraction=settings.node_reserve_fraction),
        )
        self.store, self.view, self.demand = self.replica.store, self.replica.view, self.replica.demand
        self.metrics.registry.register(FleetGpuCollector(lambda: self.view.snapshot))
        check = server_check(settings.internal_token, "placer")
        tracer = self.tracer_provider.get_tracer("hanzo.placer")
        self.servicer = PlacerServicer(settings, self.replica, tracer, check)
        self.server = new_server()
        serve_instrumented(
            self.servicer,
            SERVICE,
            tracer,
            check,
            unwrapped=frozenset({"PickStream"}),
            metrics=GrpcServerMetrics(self.metrics.registry),
        )
        placer_pb2_grpc.add_PlacerServicer_to_server(self.servicer, self.server)
        self.health = add_health_and_reflection(self.server, [SERVICE_NAME])
        self.address = bind(self.server, settings.host, settings.port)
        self.metrics_port: int | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.replica.start()
        await self.server.start()
        await set_serving(self.health, ["", SERVICE_NAME], True)
        if self.settings.metrics_port is not None:
            http_server, _ = start_http_server(self.settings.metrics_port, registry=self.metrics.registry)
            self.metrics_port = http_server.server_port
        self._tasks = [
            asyncio.create_task(self._planner_loop(), name="replica-planner"),
            asyncio.create_task(self._freshness_loop(), name="freshness"),
        ]
        redis = redact_url(self.settings.redis_url)
        log.info("placer %s listening on %s (redis %s)", self.instance_id, self.address, redis)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Health goes NOT_SERVING, in-flight calls get grace_s to finish, then everything closes."""
        await set_serving(self.health, ["", SERVICE_NAME, FRESHNESS_CHECK], False)
        await cancel_and_wait(self._tasks)
        await self.server.stop(grace_s)
        await self.replica.stop()
        shutdown_tracing(self.tracer_provider)

    async def _freshness_loop(self) -> None:
        """Mirror the view's stale flag into health (the metrics read it themselves)."""
        last: bool | None = None
        while True:
            stale = self.view.stale
            if stale != last:
                await set_serving(self.health, [FRESHNESS_CHECK], not stale)
                last = stale
            await asyncio.sleep(min(0.2, self.settings.resync_interval_s))

    async def _planner_loop(self) -> None:
        """Flush local demand; whichever placer holds the lease plans replicas for the whole cluster."""
        interval = self.settings.planner_interval_s
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):  # Redis down: the view is already marked stale
                now = time.time()
                await self.demand.flush(self.store, now, window_s=interval)
                if await self.store.hold_planner_lease(self.instance_id, ttl_s=3 * interval):
                    rates = await demand_rates(self.store, now, window_s=interval)
                    plan = plan_replicas(
                        self.view.snapshot, rates, self.settings.replica_capacity_rps, now,
                        self.settings.model_capacity_rps,
                    )  # fmt: skip
                    # Only nodes asked to change get a key; the rest have no directive (no write at all).
                    await self.store.write_placements(
                        {node: sorted(plan.desired[node]) for node in plan.changed}, ttl_s=3 * interval
                    )
