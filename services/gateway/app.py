"""The gateway process: the public Inference service in front of the placer and the workers."""

from __future__ import annotations

import logging

from opentelemetry.trace import TracerProvider
from prometheus_client import start_http_server

from hanzo.inference.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from services.common.grpc_server import add_health_and_reflection, bind, new_server, set_serving
from services.common.served import serve_instrumented
from services.common.tracing import make_tracer_provider, shutdown_tracing
from services.gateway.auth import ApiKeys
from services.gateway.config import GatewaySettings
from services.gateway.metrics import GatewayMetrics
from services.gateway.servicer import InferenceServicer
from services.gateway.upstream import Upstream
from services.placer.metrics import PlacerMetrics
from services.placer.replica import PlacerReplica

log = logging.getLogger(__name__)

SERVICE = inference_pb2.DESCRIPTOR.services_by_name["Inference"]
SERVICE_NAME = SERVICE.full_name


class GatewayApp:
    def __init__(self, settings: GatewaySettings, tracer_provider: TracerProvider | None = None) -> None:
        self.settings = settings
        self.tracer_provider = tracer_provider or make_tracer_provider("hanzo-gateway")
        self.metrics = GatewayMetrics()
        topology = common_pb2.Topology(zone=settings.zone, rack=settings.rack, host=settings.hostname)
        self.replica: PlacerReplica | None = None
        if settings.placement == "embedded":
            self.replica = PlacerReplica(
                settings.redis_url,
                settings.key_prefix,
                settings.resync_interval_s,
                {},
                PlacerMetrics(self.metrics.registry),
            )
        self.upstream = Upstream(settings.placer_address, self.tracer_provider, topology, self.replica)
        if not settings.api_keys:
            log.warning("no API keys configured (HANZO_GATEWAY_API_KEYS): the gateway is OPEN to any caller")
        self.server = new_server()
        tracer = self.tracer_provider.get_tracer("hanzo.gateway")
        servicer = InferenceServicer(settings, self.upstream, self.metrics, tracer)
        # Health and reflection are registered unwrapped: probes and grpcurl need no key.
        serve_instrumented(
            servicer, SERVICE, tracer, ApiKeys(settings.api_keys) if settings.api_keys else None
        )
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, self.server)
        self.health = add_health_and_reflection(self.server, [SERVICE_NAME])
        self.address = bind(self.server, settings.host, settings.port)
        self.metrics_port: int | None = None

    async def start(self) -> None:
        if self.replica is not None:
            await self.replica.start(demand_window_s=self.settings.demand_window_s)
        await self.server.start()
        await set_serving(self.health, ["", SERVICE_NAME], True)
        if self.settings.metrics_port is not None:
            http_server, _ = start_http_server(self.settings.metrics_port, registry=self.metrics.registry)
            self.metrics_port = http_server.server_port
        where = "embedded replica" if self.replica else self.settings.placer_address
        log.info("gateway listening on %s (placement: %s)", self.address, where)

    async def stop(self) -> None:
        """Health NOT_SERVING first (load balancers move on), then in-flight streams get drain_timeout_s."""
        await set_serving(self.health, ["", SERVICE_NAME], False)
        await self.server.stop(self.settings.drain_timeout_s)
        await self.upstream.close()
        if self.replica is not None:
            await self.replica.stop()
        shutdown_tracing(self.tracer_provider)
