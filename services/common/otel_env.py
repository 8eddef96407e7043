"""OpenTelemetry's standard environment variables for traces, read from a mapping (so tests need not set
the process's environment): where spans go (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT over
OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL) and which are kept (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG).

The SDK reads these too, but falls back to its defaults, with a log line, on a value it does not know;
a service started with a misspelt sampler would then quietly trace everything. Here a bad value stops
the service at start with a message naming the variable and what it accepts.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_PROTOCOL = "grpc"
DEFAULT_SAMPLER = "parentbased_always_on"
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


class TracingConfigError(ValueError):
    """An OTEL_* variable holds a value the mesh cannot use; the message names it."""


def traces_endpoint(environ: Mapping[str, str]) -> str | None:
    """The OTLP endpoint spans are exported to, None when neither variable is set (nothing exported)."""
    return environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")


def traces_protocol(environ: Mapping[str, str]) -> str:
    """grpc (the default, as the specification's) or http/protobuf."""
    name = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    if not environ.get(name):
        name = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = environ.get(name) or DEFAULT_PROTOCOL
    if protocol not in PROTOCOLS:
        raise TracingConfigError(
            f"{name}={protocol!r}: the mesh exports spans over {' or '.join(PROTOCOLS)}"
            " (OpenTelemetry's Python exporter has no http/json)"
        )
    return protocol


def otlp_exporter(environ: Mapping[str, str]) -> SpanExporter:
    """The OTLP span exporter the environment asks for (its endpoint from traces_endpoint)."""
    protocol = traces_protocol(environ)
    endpoint = traces_endpoint(environ)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as OverGrpc

        return OverGrpc(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as OverHttp

    if endpoint and not environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        # The base endpoint names the collector; over HTTP each signal has its own path under it.
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return OverHttp(endpoint=endpoint)


def sampler(environ: Mapping[str, str]) -> Sampler:
    """OTEL_TRACES_SAMPLER (default parentbased_always_on: a caller's sampling decision is kept, a new
    trace is sampled) with OTEL_TRACES_SAMPLER_ARG as the ratio of the *traceidratio samplers."""
    name = (environ.get("OTEL_TRACES_SAMPLER") or DEFAULT_SAMPLER).strip().lower()
    if name not in SAMPLERS:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER={name!r}: expected one of {', '.join(SAMPLERS)}")
    if name.endswith("traceidratio"):
        root: Sampler = TraceIdRatioBased(_ratio(environ.get("OTEL_TRACES_SAMPLER_ARG")))
    else:
        root = ALWAYS_OFF if name.endswith("always_off") else ALWAYS_ON
    return ParentBased(root) if name.startswith("parentbased_") else root


def _ratio(raw: str | None) -> float:
    if raw is None or not raw.strip():
        return 1.0  # the specification's default
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={raw!r}: a sampling ratio from 0 to 1")
    return ratio
