"""Inference.Chat over gRPC through the gateway: a streamed reply like Generate's, the workload class
(tools -> AGENT_TOOL unless told otherwise), bad input refused with the field named, and one trace."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import jsonschema
import pytest
import pytest_asyncio

from hanzo.inference.v1 import common_pb2, inference_pb2
from services.common.redis_server import RedisServer
from tests.mesh_e2e.conftest import AUTH, Mesh
from tests.mesh_e2e.http_helpers import shared_mesh

pytestmark = pytest.mark.asyncio(loop_scope="module")
GREEDY = inference_pb2.SamplingParams(temperature=0.0, max_tokens=8)
SYSTEM = inference_pb2.ChatMessage(role="system", content="You are terse.")
USER = inference_pb2.ChatMessage(role="user", content="What is the weather in Paris?")
SEARCH = inference_pb2.Tool(
    name="search", description="Search the web", parameters_json='{"type": "object", "properties": {}}'
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(module_redis: RedisServer, llama_gqa_dir: Path, no_template_dir: Path) -> AsyncIterator[Mesh]:
    async with shared_mesh(module_redis.url, {"llama": llama_gqa_dir, "plain": no_template_dir}) as running:
        yield running


def chat(*messages: inference_pb2.ChatMessage, **fields: object) -> inference_pb2.ChatRequest:
    fields.setdefault("model", "llama")
    fields.setdefault("sampling", GREEDY)
    return inference_pb2.ChatRequest(messages=messages or (SYSTEM, USER), **fields)  # type: ignore[arg-type]


async def collect(mesh: Mesh, request: inference_pb2.ChatRequest, metadata: tuple = AUTH) -> list:
    return [r async for r in mesh.inference.Chat(request, metadata=metadata)]


async def test_chat_streams_like_generate(mesh: Mesh) -> None:
    responses = await collect(mesh, chat())
    first, last = responses[0], responses[-1]
    assert first.node_id in {"w1", "w2"} and first.workload_class == common_pb2.WORKLOAD_CLASS_REALTIME_CHAT
    assert first.request_id and {r.request_id for r in responses} == {first.request_id}
    assert last.finish_reason in (inference_pb2.FINISH_REASON_STOP, inference_pb2.FINISH_REASON_LENGTH)
    tokens = [t for r in responses for t in r.token_ids]
    assert last.usage.completion_tokens == len(tokens) <= GREEDY.max_tokens
    assert last.usage.prompt_tokens > 0
    again = await collect(mesh, chat())  # greedy: the same tokens again
    assert [t for r in again for t in r.token_ids] == tokens


@pytest.mark.parametrize(
    ("request_fields", "metadata", "expected"),
    [
        ({"tools": [SEARCH]}, (), common_pb2.WORKLOAD_CLASS_AGENT_TOOL),
        ({"tools": [SEARCH], "workload_class": common_pb2.WORKLOAD_CLASS_BATCH}, (),
         common_pb2.WORKLOAD_CLASS_BATCH),
        ({"tools": [SEARCH]}, (("x-hanzo-workload", "realtime_chat"),),
         common_pb2.WORKLOAD_CLASS_REALTIME_CHAT),
        ({}, (("x-hanzo-workload", "batch"),), common_pb2.WORKLOAD_CLASS_BATCH),
        ({"sampling": inference_pb2.SamplingParams(max_tokens=4096)}, (), common_pb2.WORKLOAD_CLASS_BATCH),
    ],
)  # fmt: skip
async def test_chat_workload_class(mesh: Mesh, request_fields: dict, metadata: tuple, expected: int) -> None:
    call = mesh.inference.Chat(chat(**request_fields), metadata=AUTH + metadata)
    first = await call.read()
    call.cancel()
    assert first.workload_class == expected


async def test_a_tool_result_turn_is_agent_work(mesh: Mesh) -> None:
    called = inference_pb2.ChatMessage(
        role="assistant",
        tool_calls=[inference_pb2.ToolCall(id="c1", name="search", arguments='{"q": "Paris"}')],
    )
    result = inference_pb2.ChatMessage(role="tool", tool_call_id="c1", content="12 C, cloudy")
    responses = await collect(mesh, chat(SYSTEM, USER, called, result, tools=[SEARCH]))
    assert responses[0].workload_class == common_pb2.WORKLOAD_CLASS_AGENT_TOOL
    assert responses[-1].finish_reason != inference_pb2.FINISH_REASON_UNSPECIFIED


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        (chat(model=""), grpc.StatusCode.INVALID_ARGUMENT, "model"),
        (inference_pb2.ChatRequest(model="llama"), grpc.StatusCode.INVALID_ARGUMENT, "messages: "),
        (chat(inference_pb2.ChatMessage(role="wizard", content="hi")), grpc.StatusCode.INVALID_ARGUMENT,
         "messages[0].role: unknown role"),
        (chat(tools=[inference_pb2.Tool(name="f", parameters_json="[1, 2]")]),
         grpc.StatusCode.INVALID_ARGUMENT, "tools[0].parameters_json"),
        (chat(tools=[inference_pb2.Tool(name="f", parameters_json="{oops")]),
         grpc.StatusCode.INVALID_ARGUMENT, "tools[0].parameters_json"),
        (chat(sampling=inference_pb2.SamplingParams(top_p=1.5)), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
        (chat(model="gpt-9"), grpc.StatusCode.NOT_FOUND, "gpt-9"),
        # Refused by the worker: the conversation is too long after templating; no template at all.
        (chat(inference_pb2.ChatMessage(role="user", content="word " * 1500)),
         grpc.StatusCode.INVALID_ARGUMENT, "messages: "),
        (chat(model="plain"), grpc.StatusCode.FAILED_PRECONDITION, "template"),
        (chat(tool_choice="required"), grpc.StatusCode.INVALID_ARGUMENT, "tool_choice: needs tools"),
        (chat(tools=[SEARCH], tool_choice="lookup"), grpc.StatusCode.INVALID_ARGUMENT,
         "tool_choice: names no declared tool"),
        (chat(tools=[SEARCH], tool_choice="search", sampling=inference_pb2.SamplingParams(
            structured=inference_pb2.StructuredOutput(json_object=True))),
         grpc.StatusCode.INVALID_ARGUMENT, "tool_choice: forcing a tool call cannot be combined"),
    ],
)  # fmt: skip
async def test_chat_bad_input(mesh: Mesh, request_: inference_pb2.ChatRequest, code, words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(mesh, request_)
    assert err.value.code() == code and words in (err.value.details() or ""), err.value.details()


WEATHER = inference_pb2.Tool(
    name="weather",
    parameters_json=json.dumps({
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
        "additionalProperties": False,
    }),
)  # fmt: skip


@pytest.mark.parametrize(
    ("tool_choice", "names"), [("weather", {"weather"}), ("required", {"weather", "search"})]
)
async def test_a_forced_tool_call_comes_back_as_fields(mesh: Mesh, tool_choice: str, names: set[str]) -> None:
    # Random weights would never write a call of their own: the schema makes whatever they say one.
    sampling = inference_pb2.SamplingParams(temperature=1.0, seed=3, max_tokens=120)
    responses = await collect(mesh, chat(tools=[SEARCH, WEATHER], tool_choice=tool_choice, sampling=sampling))
    last = responses[-1]
    assert last.finish_reason == inference_pb2.FINISH_REASON_TOOL_CALLS, "".join(r.text for r in responses)
    (call,) = last.tool_calls
    assert call.name in names and call.id.startswith("call_")
    arguments = json.loads(call.arguments)
    if call.name == "weather":
        jsonschema.validate(arguments, json.loads(WEATHER.parameters_json))
    assert json.loads("".join(r.text for r in responses)) == {"name": call.name, "arguments": arguments}
    assert not any(r.tool_calls for r in responses[:-1])


async def test_a_reply_without_calls_under_auto_is_plain_text(mesh: Mesh) -> None:
    responses = await collect(mesh, chat(tools=[SEARCH]))  # auto: random weights write no <tool_call>
    assert not responses[-1].tool_calls
    assert responses[-1].finish_reason == inference_pb2.FINISH_REASON_LENGTH


async def test_chat_needs_a_key(mesh: Mesh) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(mesh, chat(), metadata=())
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_one_trace_spans_gateway_and_worker(mesh: Mesh) -> None:
    mesh.spans.clear()
    await collect(mesh, chat())
    spans = mesh.spans.get_finished_spans()
    server = next(s for s in spans if s.name.endswith("Inference/Chat") and s.kind.name == "SERVER")
    in_trace = [s for s in spans if s.context.trace_id == server.context.trace_id]
    assert {s.resource.attributes["service.name"] for s in in_trace} >= {"hanzo-gateway", "hanzo-worker"}
    assert {"classify", "queue", "prefill", "decode"} <= {s.name for s in in_trace}
