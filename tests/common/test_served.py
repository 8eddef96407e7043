"""The served wrapper on a real grpc.aio server over loopback: statuses for typed errors, the handler's own
aborts and bugs, the caller check, and one SERVER span per call continuing the caller's trace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc
from services.common.errors import InvalidArgument, NotFound, Unauthenticated
from services.common.served import serve_instrumented
from services.common.tracing import client_call_span, local_span, make_tracer_provider
from tests.placer.cluster_helpers import eventually

SERVICE = inference_pb2.DESCRIPTOR.services_by_name["Inference"]
GENERATE = "/hanzo.inference.v1.Inference/Generate"


class Scripted(inference_pb2_grpc.InferenceServicer):
    """Does what the request's model name says."""

    def __init__(self) -> None:
        self.streams_closed = asyncio.Event()

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        if request.model == "typed":
            raise InvalidArgument("prompt", "is empty")
        if request.model == "abort":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not now")
        if request.model == "bug":
            raise KeyError("oops")
        try:
            for i in range(1000 if request.model == "endless" else 3):
                yield inference_pb2.GenerateResponse(token_ids=[i])
                await asyncio.sleep(0)
        finally:
            self.streams_closed.set()

    async def ListModels(
        self, request: inference_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ListModelsResponse:
        trace.get_current_span().set_attribute("hanzo.seen", True)  # the handler runs inside the span
        raise NotFound("no models here")


def _authenticate(metadata: object) -> None:
    if dict(metadata).get("authorization") != "Bearer k":  # type: ignore[call-overload]
        raise Unauthenticated("unknown API key")


@pytest.fixture
async def served() -> AsyncIterator[tuple[inference_pb2_grpc.InferenceStub, InMemorySpanExporter, Scripted]]:
    spans = InMemorySpanExporter()
    provider = make_tracer_provider("served-test", spans)
    servicer = Scripted()
    server = grpc.aio.server()
    serve_instrumented(servicer, SERVICE, provider.get_tracer("test"), _authenticate)
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield inference_pb2_grpc.InferenceStub(channel), spans, servicer
    await server.stop(None)


AUTH = (("authorization", "Bearer k"),)


async def _one_span(spans: InMemorySpanExporter) -> tuple:
    """The finished spans once there is one: the caller sees a status as it is sent, which can be
    before the server's handler has left its span."""

    async def ended() -> bool:
        return len(spans.get_finished_spans()) >= 1

    await eventually(ended, 10, "the server span ended")
    return spans.get_finished_spans()


async def _generate(stub: inference_pb2_grpc.InferenceStub, model: str, metadata: object = AUTH) -> list[int]:
    call = stub.Generate(inference_pb2.GenerateRequest(model=model, prompt="x"), metadata=metadata)
    return [t async for r in call for t in r.token_ids]


@pytest.mark.parametrize(
    ("model", "code", "details", "span_error"),
    [
        ("typed", grpc.StatusCode.INVALID_ARGUMENT, "prompt: is empty", False),
        ("abort", grpc.StatusCode.FAILED_PRECONDITION, "not now", False),
        ("bug", grpc.StatusCode.UNKNOWN, "KeyError", True),
    ],
)
async def test_failures_get_their_status_on_the_wire_and_on_the_span(
    served: tuple, model: str, code: grpc.StatusCode, details: str, span_error: bool
) -> None:
    stub, spans, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _generate(stub, model)
    assert err.value.code() == code
    assert details in (err.value.details() or "")
    (span,) = await _one_span(spans)
    assert (span.name, span.kind) == (GENERATE, trace.SpanKind.SERVER)
    assert span.attributes["rpc.grpc.status_code"] == code.value[0]
    assert (span.status.status_code == trace.StatusCode.ERROR) == span_error


async def test_a_good_call_streams_and_continues_the_callers_trace(served: tuple) -> None:
    stub, spans, _ = served
    caller = make_tracer_provider("caller", InMemorySpanExporter()).get_tracer("caller")
    with caller.start_as_current_span("client") as parent:
        carrier: dict[str, str] = {}
        inject(carrier)
        assert await _generate(stub, "ok", (*AUTH, *carrier.items())) == [0, 1, 2]
    (span,) = spans.get_finished_spans()
    assert span.context.trace_id == parent.get_span_context().trace_id
    assert span.parent is not None and span.parent.span_id == parent.get_span_context().span_id
    assert dict(span.attributes) == {
        "rpc.system": "grpc", "rpc.service": "hanzo.inference.v1.Inference", "rpc.method": "Generate",
        "rpc.grpc.status_code": 0,
    }  # fmt: skip


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer nope"),)])
async def test_the_caller_check_runs_before_the_handler(served: tuple, metadata: tuple) -> None:
    stub, _spans, servicer = served
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _generate(stub, "ok", metadata)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "unknown API key" in (err.value.details() or "")
    assert not servicer.streams_closed.is_set()  # the handler never started


async def test_unary_errors_map_and_the_handler_sees_its_span(served: tuple) -> None:
    stub, spans, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListModels(inference_pb2.ListModelsRequest(), metadata=AUTH)
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.NOT_FOUND, "no models here")
    (span,) = await _one_span(spans)
    assert span.attributes["hanzo.seen"] is True
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]


async def test_a_cancelled_stream_closes_the_handler_and_ends_its_span(served: tuple) -> None:
    stub, spans, servicer = served
    call = stub.Generate(inference_pb2.GenerateRequest(model="endless", prompt="x"), metadata=AUTH)
    await call.read()
    call.cancel()
    await asyncio.wait_for(servicer.streams_closed.wait(), 10)
    (span,) = await _one_span(spans)
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]


def test_with_nothing_to_export_spans_are_not_recorded_but_the_context_passes_on() -> None:
    tracer = make_tracer_provider("quiet", environ={}).get_tracer("quiet")
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracer.start_as_current_span("server", context=extract({"traceparent": traceparent})) as span:
        assert not span.is_recording()
        with tracer.start_as_current_span("pick"):
            carrier: dict[str, str] = {}
            inject(carrier)
    assert carrier["traceparent"] == traceparent  # the next hop continues the caller's trace


class Forwarding(inference_pb2_grpc.InferenceServicer):
    """Answers with the trace context it would send to the next hop (a gateway's path, untraced)."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        if request.model == "typed":
            raise InvalidArgument("model", "is unknown")
        with local_span(self.tracer, "pick"), client_call_span(self.tracer, "/next/Hop") as (_, metadata):
            yield inference_pb2.GenerateResponse(text=dict(metadata).get("traceparent", ""))


@pytest.mark.parametrize("caller_traced", [True, False])
async def test_untraced_service_passes_on_only_a_callers_trace(caller_traced: bool) -> None:
    tracer = make_tracer_provider("quiet", environ={}).get_tracer("quiet")
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    server = grpc.aio.server()
    servicer = Forwarding(tracer)
    serve_instrumented(servicer, SERVICE, tracer)
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            metadata = (("traceparent", traceparent),) if caller_traced else ()
            call = stub.Generate(inference_pb2.GenerateRequest(model="m", prompt="x"), metadata=metadata)
            sent_on = [r.text async for r in call]
            assert sent_on == [traceparent if caller_traced else ""]
            with pytest.raises(grpc.aio.AioRpcError) as failed:  # errors still map without a span
                await _generate(stub, "typed", metadata)
            assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await server.stop(None)
