"""Pieces every service's gRPC server shares: the server, health, reflection, graceful stop. Tracing, error
mapping and caller checks wrap each servicer's methods instead (served.py)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.channels import SERVER_OPTIONS


def new_server() -> grpc.aio.Server:
    """A grpc.aio server with no interceptors: with none, grpc.aio finds each call's handler without a
    coroutine chain (see served.py for what replaced them). It accepts its callers' keepalive pings
    (channels.py)."""
    return grpc.aio.server(options=SERVER_OPTIONS)


def add_health_and_reflection(server: grpc.aio.Server, service_names: list[str]) -> health.aio.HealthServicer:
    """Register the standard health service (every name SERVING) and reflection, so grpcurl works."""
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
        server,
    )
    return health_servicer


async def set_serving(health_servicer: health.aio.HealthServicer, names: list[str], serving: bool) -> None:
    """Mark each named check ("" is the whole server) SERVING or NOT_SERVING."""
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in names:
        await health_servicer.set(name, status)


def bind(server: grpc.aio.Server, host: str, port: int) -> str:
    """Listen on host:port (0 picks a free port); returns the address actually bound."""
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    return f"{host}:{bound}"
