"""Where spans go and which are kept, from OpenTelemetry's standard variables: spans reach a real OTLP
receiver over gRPC and over HTTP (OTEL_EXPORTER_OTLP_PROTOCOL), the sampler follows
OTEL_TRACES_SAMPLER(_ARG), and a value the mesh cannot use stops it naming the variable."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider

from services.common.otel_env import TracingConfigError, sampler, traces_protocol
from services.common.tracing import make_tracer_provider, shutdown_tracing

Received = list[trace_service_pb2.ExportTraceServiceRequest]


class _GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request, context):  # type: ignore[no-untyped-def]  # the generated servicer's shape
        self.received.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.contextmanager
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    """A real OTLP/gRPC trace receiver on loopback: its endpoint URL and what it received."""
    received: Received = []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_GrpcReceiver(received), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(grace=None)


@contextlib.contextmanager
def http_receiver() -> Iterator[tuple[str, Received]]:
    """A real OTLP/HTTP (protobuf) trace receiver at /v1/traces: its base URL and what it received."""
    received: Received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.path != "/v1/traces" or self.headers["content-type"] != "application/x-protobuf":
                self.send_error(404)
                return
            received.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def _exported_names(received: Received) -> list[tuple[str, str]]:
    """(service.name, span name) of every span received."""
    names = []
    for request in received:
        for resource_spans in request.resource_spans:
            service = next(
                a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"
            )
            names += [(service, s.name) for scope in resource_spans.scope_spans for s in scope.spans]
    return names


def _emit(provider: trace.TracerProvider, *names: str) -> None:
    tracer = provider.get_tracer("test")
    for name in names:
        tracer.start_span(name).end()
    assert isinstance(provider, TracerProvider)
    assert provider.force_flush(timeout_millis=10_000)  # exported, and acknowledged by the receiver


@pytest.mark.parametrize(
    ("receiver", "protocol"),
    [(grpc_receiver, None), (grpc_receiver, "grpc"), (http_receiver, "http/protobuf")],
    ids=["default", "grpc", "http"],
)
def test_spans_reach_a_real_otlp_receiver_over_the_protocol_asked_for(receiver, protocol) -> None:  # type: ignore[no-untyped-def]
    with receiver() as (endpoint, received):
        environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "otlp-test"}
        if protocol is not None:
            environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = protocol
        provider = make_tracer_provider("ignored", environ=environ)
        _emit(provider, "chat llama")
        shutdown_tracing(provider)
    assert _exported_names(received) == [("otlp-test", "chat llama")]


def test_the_traces_variables_win_over_the_general_ones() -> None:
    with http_receiver() as (endpoint, received):
        environ = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",  # nothing listens: must not be used
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{endpoint}/v1/traces",  # used as it is
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        }
        provider = make_tracer_provider("traces-only", environ=environ)
        _emit(provider, "embeddings minilm")
        shutdown_tracing(provider)
    assert _exported_names(received) == [("traces-only", "embeddings minilm")]


@pytest.mark.parametrize(
    ("environ", "exported"),
    [
        ({}, 10),  # parentbased_always_on
        ({"OTEL_TRACES_SAMPLER": "always_off"}, 0),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}, 0),
        ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1"}, 10),
        ({"OTEL_TRACES_SAMPLER": "PARENTBASED_ALWAYS_OFF"}, 0),  # names are not case-sensitive
    ],
)
def test_the_sampler_keeps_what_otel_traces_sampler_says(environ: dict[str, str], exported: int) -> None:
    with grpc_receiver() as (endpoint, received):
        provider = make_tracer_provider(
            "sampled", environ={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, **environ}
        )
        _emit(provider, *[f"span {i}" for i in range(10)])
        shutdown_tracing(provider)
    assert len(_exported_names(received)) == exported


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER='sometimes'"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='udp'"),
    ],
)
def test_a_value_the_mesh_cannot_use_stops_it_naming_the_variable(
    environ: dict[str, str], named: str
) -> None:
    with pytest.raises(TracingConfigError, match=named.replace("[", r"\[")):
        make_tracer_provider("bad", environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", **environ})


def test_without_an_endpoint_nothing_is_recorded_and_the_defaults_are_the_specifications() -> None:
    assert isinstance(make_tracer_provider("quiet", environ={}), trace.NoOpTracerProvider)
    assert traces_protocol({}) == "grpc"
    assert "ParentBased" in sampler({}).get_description()
