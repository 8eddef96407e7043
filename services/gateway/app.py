"""The gateway process: the public Inference service in front of the placer and the workers, over gRPC
and (same request path, same event loop) an OpenAI-compatible HTTP front."""

from __future__ import annotations

import asyncio
import logging

from opentelemetry.trace import TracerProvider
from prometheus_client import start_http_server

from hanzo.inference.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from services.common.grpc_metrics import GrpcServerMetrics
from services.common.grpc_server import add_health_and_reflection, bind, new_server, set_serving
from services.common.served import serve_instrumented
from services.common.tracing import make_tracer_provider, shutdown_tracing
from services.gateway.auth import ApiKeys
from services.gateway.config import GatewaySettings, Placement
from services.gateway.ejections import Ejections
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai.app import build_app
from services.gateway.openai.front import Front
from services.gateway.openai.server import HttpServer
from services.gateway.rate_limit import Gatekeeper, RateLimiter
from services.gateway.router import Router
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
        if settings.placement is Placement.EMBEDDED:
            self.replica = PlacerReplica(
                settings.redis_url,
                settings.key_prefix,
                settings.resync_interval_s,
                {},
                PlacerMetrics(self.metrics.registry),
                settings.prefix_capacity,
                settings.prefix_balance,
            )
        self.upstream = Upstream(
            settings.placer_address,
            self.tracer_provider,
            topology,
            self.replica,
            settings.internal_token,
            settings.worker_keepalive_s,
            Ejections(settings.eject_s, self.metrics.ejections),
        )
        if not settings.api_keys:
            log.warning("no API keys configured (HANZO_GATEWAY_API_KEYS): the gateway is OPEN to any caller")
        self.server = new_server()
        tracer = self.tracer_provider.get_tracer("hanzo.gateway")
        keys = ApiKeys(settings.api_keys) if settings.api_keys else None
        limiter = None
        if settings.rate_limit_rps > 0:
            limiter = RateLimiter(settings.rate_limit_rps, settings.burst, self.metrics.rate_limited)
        authenticate = Gatekeeper(keys, limiter) if keys or limiter else None
        self.router = Router(settings, self.upstream, tracer, self.metrics.tenant_tokens)
        servicer = InferenceServicer(self.router, self.metrics, tracer)
        # Health and reflection are registered unwrapped: probes and grpcurl need no key.
        serve_instrumented(
            servicer, SERVICE, tracer, authenticate, metrics=GrpcServerMetrics(self.metrics.registry)
        )
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, self.server)
        self.health = add_health_and_reflection(self.server, [SERVICE_NAME])
        self.address = bind(self.server, settings.host, settings.port)
        self.metrics_port: int | None = None
        self.front = Front(self.router, settings, self.metrics, tracer, authenticate)
        self.http: HttpServer | None = None
        if settings.http_port is not None:
            app = build_app(self.front)
            self.http = HttpServer(app, settings.host, settings.http_port, settings.drain_timeout_s)

    @property
    def http_address(self) -> str | None:
        """HOST:PORT of the OpenAI-compatible HTTP front once started; None when it is off."""
        return self.http.address if self.http is not None else None

    async def start(self) -> None:
        if self.replica is not None:
            await self.replica.start(demand_window_s=self.settings.demand_window_s)
        await self.server.start()
        if self.http is not None:
            await self.http.start()
        await set_serving(self.health, ["", SERVICE_NAME], True)
        if self.settings.metrics_port is not None:
            http_server, _ = start_http_server(self.settings.metrics_port, registry=self.metrics.registry)
            self.metrics_port = http_server.server_port
        where = "embedded replica" if self.replica else self.settings.placer_address
        log.info(
            "gateway listening on %s, HTTP on %s (placement: %s)", self.address, self.http_address, where
        )

    async def stop(self) -> None:
        """Health NOT_SERVING first (load balancers move on), then in-flight streams of both fronts get
        drain_timeout_s, together, before the worker links close."""
        await set_serving(self.health, ["", SERVICE_NAME], False)
        self.front.serving = False
        stopping = [self.server.stop(self.settings.drain_timeout_s)]
        if self.http is not None:
            stopping.append(self.http.stop())
        await asyncio.gather(*stopping)
        await self.upstream.close()
        if self.replica is not None:
            await self.replica.stop()
        shutdown_tracing(self.tracer_provider)
