"""What serving a method through services/common/served.py costs per call, against a bare handler and the
OpenTelemetry gRPC instrumentation's server interceptor alone; prints one JSON line.

    .venv/bin/python bench/served_overhead.py [--quick]

Variants: bare; the instrumentation's interceptor alone (spans recorded); the served wrapper (tracing,
error mapping, API-key check) with spans recorded, as when a collector is configured; and the same with
the default no-op tracer provider (no collector: nothing recorded, context still propagated).

One process, one loopback server per variant, the same streaming handler (8 small messages) behind each;
calls are serial and the variants interleave in blocks, so drift on a noisy machine hits all of them
alike. Reports per variant the median time to first message and the process CPU per call (client and
server together: the difference between variants is the server's).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.sdk.trace import TracerProvider as RecordingTracerProvider

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc
from services.common.served import serve_instrumented
from services.common.tracing import make_tracer_provider
from services.gateway.auth import ApiKeys

SERVICE = inference_pb2.DESCRIPTOR.services_by_name["Inference"]
MESSAGES = 8
CALLS_PER_BLOCK = 50


class Tokens(inference_pb2_grpc.InferenceServicer):
    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        for i in range(MESSAGES):
            yield inference_pb2.GenerateResponse(token_ids=[i])


def _server(variant: str) -> grpc.aio.Server:
    # Spans recorded (and dropped), as with a collector configured; "served_untraced" is the default with
    # none configured, where make_tracer_provider gives the no-op provider.
    provider = make_tracer_provider("bench") if variant == "served_untraced" else RecordingTracerProvider()
    servicer = Tokens()
    if variant == "otel_interceptor":
        server = grpc.aio.server(interceptors=[aio_server_interceptor(tracer_provider=provider)])
    else:
        server = grpc.aio.server()
    if variant.startswith("served"):  # tracing, error mapping and the API-key check
        serve_instrumented(servicer, SERVICE, provider.get_tracer("bench"), ApiKeys(frozenset({"k"})))
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    return server


async def _measure(blocks: int) -> dict[str, dict[str, float]]:
    variants = ("bare", "otel_interceptor", "served", "served_untraced")
    servers, stubs, channels = [], {}, []
    for variant in variants:
        server = _server(variant)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        channels.append(channel)
        stubs[variant] = inference_pb2_grpc.InferenceStub(channel)
    request = inference_pb2.GenerateRequest(model="m", prompt="hi")
    metadata = (("authorization", "Bearer k"),)
    ttft: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    gc.freeze()  # as every service does after start
    warmup = 3
    for block in range(blocks + warmup):
        for variant in variants:
            cpu_start = time.process_time()
            for _ in range(CALLS_PER_BLOCK):
                start = time.perf_counter()
                first = None
                async for _ in stubs[variant].Generate(request, metadata=metadata):
                    first = first or time.perf_counter()
                if block >= warmup:
                    ttft[variant].append((first or start) - start)
            if block >= warmup:
                cpu[variant].append((time.process_time() - cpu_start) / CALLS_PER_BLOCK)
    for channel in channels:
        await channel.close()
    for server in servers:
        await server.stop(None)
    return {
        v: {
            "ttft_us_p50": round(statistics.median(ttft[v]) * 1e6),
            "cpu_us_per_call": round(statistics.median(cpu[v]) * 1e6),
        }
        for v in variants
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer blocks: a few seconds")
    args = parser.parse_args()
    blocks = 8 if args.quick else 40
    result = asyncio.run(_measure(blocks))
    bare = result["bare"]
    added = {f"{v}_added_ttft_us_p50": r["ttft_us_p50"] - bare["ttft_us_p50"] for v, r in result.items()}
    del added["bare_added_ttft_us_p50"]
    summary = {**added, "variants": result, "calls_per_variant": blocks * CALLS_PER_BLOCK}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
