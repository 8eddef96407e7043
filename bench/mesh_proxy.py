"""A bare gRPC pass-through for bench/mesh.py: Worker.Generate forwarded to one worker with no auth,
validation, classification, pick, tracing or metrics, and a Generate call per request where the gateway
uses its GenerateStreams link. What it adds to time to first token is the cost of one Python grpc.aio
hop made the plain way on this machine, measured in the same run as the gateway.

    python -m bench.mesh_proxy    (HANZO_BENCH_PROXY_UPSTREAM=host:port, HANZO_BENCH_PROXY_PORT=0)
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import grpc

from hanzo.inference.v1 import inference_pb2, worker_pb2_grpc
from services.common.service_main import run


class PassThrough(worker_pb2_grpc.WorkerServicer):
    def __init__(self, upstream: worker_pb2_grpc.WorkerStub) -> None:
        self.upstream = upstream

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        # The caller's deadline goes on, as the gateway passes it on: the worker schedules by it.
        async for response in self.upstream.Generate(request, timeout=context.time_remaining()):
            yield response


class ProxyApp:
    def __init__(self, upstream: str, port: int) -> None:
        self.channel = grpc.aio.insecure_channel(upstream)
        self.server = grpc.aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(
            PassThrough(worker_pb2_grpc.WorkerStub(self.channel)), self.server
        )
        self.address = f"127.0.0.1:{self.server.add_insecure_port(f'127.0.0.1:{port}')}"

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(1.0)
        await self.channel.close()


if __name__ == "__main__":
    run(
        lambda: ProxyApp(
            os.environ["HANZO_BENCH_PROXY_UPSTREAM"], int(os.environ.get("HANZO_BENCH_PROXY_PORT", "0"))
        ),
        lambda app: f"PROXY_READY address={app.address}",
    )
