"""One request's trace through a real mesh, read as OpenTelemetry's GenAI conventions describe it: the
transport's SERVER span (the HTTP front's from the ASGI instrumentation, or the gRPC method's), under
it the gateway's `{operation} {model}` span with the request's sampling settings and the response's id,
finish reasons and usage, the pick and the worker call under that, and on the worker its queue, prefill
and decode with the scheduler's decision. A caller's W3C trace is continued; a refusal is marked with
error.type."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import openai
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan

from hanzo.inference.v1 import inference_pb2
from services.common.redis_server import RedisServer
from tests.mesh_e2e.conftest import AUTH, Mesh
from tests.mesh_e2e.http_helpers import MESSAGES, sdk, shared_mesh

pytestmark = pytest.mark.asyncio(loop_scope="module")
# A caller's W3C trace context: trace 0af7..., its span b7ad..., sampled.
CALLER_TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = {"traceparent": f"00-{CALLER_TRACE_ID:032x}-{CALLER_SPAN_ID:016x}-01"}
SAMPLING = {"temperature": 0.5, "top_p": 0.9, "max_tokens": 5, "seed": 7}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(module_redis: RedisServer, llama_gqa_dir: Path, minilm_dir: Path) -> AsyncIterator[Mesh]:
    async with shared_mesh(module_redis.url, {"llama": llama_gqa_dir, "minilm": minilm_dir}) as running:
        yield running


def _one(spans: list[ReadableSpan], name: str, kind: str | None = None) -> ReadableSpan:
    found = [s for s in spans if s.name == name and (kind is None or s.kind.name == kind)]
    assert len(found) == 1, f"{name}: {[(s.name, s.kind.name) for s in spans]}"
    return found[0]


def _children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def _service(span: ReadableSpan) -> str:
    return str(span.resource.attributes["service.name"])


def _check_generation(
    spans: list[ReadableSpan], genai: ReadableSpan, operation: str
) -> dict[str, ReadableSpan]:
    """Below the gateway's GenAI span: the pick and the worker call, and on the worker the request's
    SERVER span with the same conventions and its engine phases with the scheduler's decision."""
    below = _children(spans, genai)
    assert {s.name for s in below} >= {
        "/hanzo.inference.v1.Placer/Pick",
        "/hanzo.inference.v1.Worker/Generate",
    }
    call = _one(below, "/hanzo.inference.v1.Worker/Generate", "CLIENT")
    worker = _one(_children(spans, call), "/hanzo.inference.v1.Worker/Generate", "SERVER")
    assert _service(worker) == "hanzo-worker"
    assert worker.attributes["gen_ai.operation.name"] == operation
    assert worker.attributes["gen_ai.provider.name"] == "hanzo"
    for key in ("gen_ai.response.finish_reasons", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        assert worker.attributes[key] == genai.attributes[key], key
    phases = {s.name: s for s in _children(spans, worker)}
    assert {"queue", "prefill", "decode"} <= set(phases)
    queue = phases["queue"].attributes
    assert queue["hanzo.workload_class"] == genai.attributes["hanzo.workload_class"]
    assert queue["hanzo.scheduler.budget_tokens"] > 0  # the step that let it in
    assert isinstance(queue["hanzo.scheduler.nested"], bool) and queue["hanzo.scheduler.preemptions"] == 0
    decoded = [
        s.attributes["gen_ai.usage.output_tokens"] for s in _children(spans, worker) if s.name == "decode"
    ]
    assert sum(decoded) == genai.attributes["gen_ai.usage.output_tokens"]  # a decode span per choice
    assert phases["queue"].end_time <= phases["prefill"].start_time + 1_000  # ns: one clock conversion apart
    return phases


@pytest.mark.parametrize("stream", [False, True])
async def test_an_http_chat_is_one_trace_from_the_callers_span_to_the_engine(
    mesh: Mesh, stream: bool
) -> None:
    mesh.spans.clear()
    client = sdk(mesh)
    args = {"model": "llama", "messages": MESSAGES, "extra_headers": TRACEPARENT, **SAMPLING}
    if stream:
        chunks = [c async for c in await client.chat.completions.create(**args, stream=True)]
        reply_id, finish = (
            chunks[0].id,
            next(c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason),
        )
        output_tokens = None
    else:
        reply = await client.chat.completions.create(**args)
        reply_id, finish, output_tokens = (
            reply.id,
            reply.choices[0].finish_reason,
            reply.usage.completion_tokens,
        )
    spans = [s for s in mesh.spans.get_finished_spans() if s.context.trace_id == CALLER_TRACE_ID]

    server = _one(spans, "POST /v1/chat/completions", "SERVER")
    assert server.parent is not None and server.parent.span_id == CALLER_SPAN_ID  # the caller's trace
    assert server.attributes["http.route"] == "/v1/chat/completions"
    genai = _one(_children(spans, server), "chat llama", "INTERNAL")
    attributes = genai.attributes
    assert attributes["gen_ai.provider.name"] == "hanzo"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == attributes["gen_ai.response.model"] == "llama"
    assert attributes["gen_ai.request.temperature"] == 0.5
    assert attributes["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert attributes["gen_ai.request.max_tokens"] == 5
    assert attributes["gen_ai.request.seed"] == 7
    assert reply_id == f"chatcmpl-{attributes['gen_ai.response.id']}"
    assert attributes["gen_ai.response.finish_reasons"] == (finish,)
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert output_tokens is None or attributes["gen_ai.usage.output_tokens"] == output_tokens
    assert [e.name for e in genai.events] == ["first_token"]
    phases = _check_generation(spans, genai, "chat")
    # Alone on its worker: let in by an ordinary step, not one nested in another's layers (n=2 below may
    # be: its second choice can arrive while the first's step runs, and be run between its layers).
    assert phases["queue"].attributes["hanzo.scheduler.nested"] is False


async def test_a_grpc_generate_nests_its_genai_span_under_the_method(mesh: Mesh) -> None:
    mesh.spans.clear()
    sampling = inference_pb2.SamplingParams(max_tokens=4, ignore_eos=True, n=2)
    request = inference_pb2.GenerateRequest(model="llama", prompt="trace me", sampling=sampling)
    responses = [r async for r in mesh.inference.Generate(request, metadata=AUTH)]
    spans = mesh.spans.get_finished_spans()
    server = _one(spans, "/hanzo.inference.v1.Inference/Generate", "SERVER")
    spans = [s for s in spans if s.context.trace_id == server.context.trace_id]
    genai = _one(_children(spans, server), "text_completion llama", "INTERNAL")
    assert genai.attributes["gen_ai.request.temperature"] == 1.0  # unset: the engine's default
    assert genai.attributes["gen_ai.request.choice.count"] == 2
    assert genai.attributes["gen_ai.response.finish_reasons"] == ("length", "length")
    assert genai.attributes["gen_ai.usage.output_tokens"] == 8  # both choices
    assert genai.attributes["gen_ai.response.id"] == responses[0].request_id
    _check_generation(spans, genai, "text_completion")


async def test_embeddings_have_their_genai_span(mesh: Mesh) -> None:
    mesh.spans.clear()
    reply = await sdk(mesh).embeddings.create(
        model="minilm", input=["the sea", "a ship"], extra_headers=TRACEPARENT
    )
    spans = [s for s in mesh.spans.get_finished_spans() if s.context.trace_id == CALLER_TRACE_ID]
    server = _one(spans, "POST /v1/embeddings", "SERVER")
    genai = _one(_children(spans, server), "embeddings minilm", "INTERNAL")
    assert genai.attributes["gen_ai.operation.name"] == "embeddings"
    assert genai.attributes["gen_ai.usage.input_tokens"] == reply.usage.prompt_tokens > 0
    assert "/hanzo.inference.v1.Worker/Embed" in {s.name for s in _children(spans, genai)}


async def test_a_refused_request_is_marked_with_its_error_type(mesh: Mesh) -> None:
    mesh.spans.clear()
    with pytest.raises(openai.NotFoundError):
        await sdk(mesh).chat.completions.create(
            model="no-such-model", messages=MESSAGES, extra_headers=TRACEPARENT
        )
    spans = [s for s in mesh.spans.get_finished_spans() if s.context.trace_id == CALLER_TRACE_ID]
    genai = _one(spans, "chat no-such-model", "INTERNAL")
    assert genai.attributes["error.type"] == "NOT_FOUND"
    assert genai.status.status_code.name == "ERROR"
    server = _one(spans, "POST /v1/chat/completions", "SERVER")
    status = server.attributes.get("http.response.status_code", server.attributes.get("http.status_code"))
    assert status == 404


async def test_probes_and_scrapes_make_no_spans(mesh: Mesh) -> None:
    mesh.spans.clear()
    async with httpx2.AsyncClient(base_url=f"http://{mesh.gateway.http_address}") as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        assert (
            await client.get("/v1/models/llama", headers={"authorization": AUTH[0][1]})
        ).status_code == 200
    names = [
        s.name
        for s in mesh.spans.get_finished_spans()
        if s.kind.name == "SERVER" and _service(s) == "hanzo-gateway"
    ]
    assert names == ["GET /v1/models/{model}"]
