"""OpenTelemetry for every service: one tracer provider per service instance (no global state), gRPC
instrumentation that propagates W3C trace context over every hop, OTLP export only when configured."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import grpc
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter


def make_tracer_provider(
    service_name: str, exporter: SpanExporter | None = None, environ: Mapping[str, str] = os.environ
) -> TracerProvider:
    """A provider exporting to `exporter` (tests), else to OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set,
    else nowhere (spans are still created, so context still propagates to the next hop)."""
    name = environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def server_interceptor(provider: TracerProvider) -> grpc.aio.ServerInterceptor:
    """Starts a server span per call, continuing the caller's trace from the metadata."""
    return aio_server_interceptor(tracer_provider=provider)


def client_interceptors(provider: TracerProvider) -> list[grpc.aio.ClientInterceptor]:
    """Client spans per outgoing call, injecting the trace context into the metadata."""
    return aio_client_interceptors(tracer_provider=provider)


def monotonic_to_ns(t_monotonic: float) -> int:
    """A time.monotonic() reading as Unix nanoseconds, for spans recorded after the fact."""
    return time.time_ns() - int((time.monotonic() - t_monotonic) * 1e9)


def record_span(
    tracer: trace.Tracer,
    name: str,
    start_monotonic: float,
    end_monotonic: float,
    attributes: Mapping[str, object],
) -> None:
    """A child span of the current span covering [start, end] (engine phases measured in its thread)."""
    span = tracer.start_span(name, start_time=monotonic_to_ns(start_monotonic), attributes=dict(attributes))
    span.end(end_time=monotonic_to_ns(end_monotonic))
