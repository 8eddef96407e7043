"""The OpenAI-compatible HTTP front through the official `openai` SDK against a real mesh: models,
chat (plain, streamed, content parts, tools), text completions (text and token ids) and embeddings,
each checked against the same request over gRPC. One mesh serves the whole module."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from hanzo.inference.v1 import inference_pb2
from services.common.redis_server import RedisServer
from tests.mesh_e2e.conftest import AUTH, Mesh
from tests.mesh_e2e.http_helpers import MESSAGES, requests_counted, sdk, shared_mesh

pytestmark = pytest.mark.asyncio(loop_scope="module")
GREEDY = {"temperature": 0.0, "max_tokens": 12}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(
    module_redis: RedisServer, llama_gqa_dir: Path, minilm_dir: Path, no_template_dir: Path
) -> AsyncIterator[Mesh]:
    models = {"llama": llama_gqa_dir, "minilm": minilm_dir, "plain": no_template_dir}
    async with shared_mesh(module_redis.url, models) as running:
        yield running


async def grpc_chat(
    mesh: Mesh, messages: list[dict], **sampling: object
) -> list[inference_pb2.GenerateResponse]:
    request = inference_pb2.ChatRequest(
        model="llama",
        messages=[inference_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in messages],
        sampling=inference_pb2.SamplingParams(**sampling),  # type: ignore[arg-type]
    )
    return [r async for r in mesh.inference.Chat(request, metadata=AUTH)]


async def test_models_list_and_retrieve(mesh: Mesh) -> None:
    client = sdk(mesh)
    page = await client.models.list()
    assert [(m.id, m.object, m.owned_by) for m in page.data] == [
        ("llama", "model", "hanzo"), ("minilm", "model", "hanzo"), ("plain", "model", "hanzo")
    ]  # fmt: skip
    assert all(m.created > 0 for m in page.data)
    assert (await client.models.retrieve("minilm")).id == "minilm"


async def test_chat_streamed_equals_plain_and_grpc_chat(mesh: Mesh) -> None:
    client = sdk(mesh)
    plain = await client.chat.completions.create(model="llama", messages=MESSAGES, **GREEDY)
    assert plain.id.startswith("chatcmpl-") and plain.object == "chat.completion" and plain.model == "llama"
    choice = plain.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    usage = plain.usage
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 1 <= usage.completion_tokens <= 12 and (choice.finish_reason == "stop") == (
        usage.completion_tokens < 12
    )

    stream = await client.chat.completions.create(
        model="llama", messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].id.startswith("chatcmpl-")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [choice.finish_reason]
    last = chunks[-1]  # include_usage: a final chunk with no choices carries the usage
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )

    responses = await grpc_chat(mesh, MESSAGES, **GREEDY)
    assert "".join(r.text for r in responses) == text
    assert responses[-1].usage.prompt_tokens == usage.prompt_tokens


async def test_chat_content_parts_join_like_text(mesh: Mesh) -> None:
    client = sdk(mesh)
    parts = [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "about the sea."}]
    as_parts = await client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": parts}], **GREEDY
    )
    as_text = await client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "Tell me\nabout the sea."}], **GREEDY
    )
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    assert as_parts.usage.prompt_tokens == as_text.usage.prompt_tokens


async def test_chat_classes_tools_header_and_body(mesh: Mesh) -> None:
    registry = mesh.gateway.metrics.registry
    client = sdk(mesh)
    cases = [
        ({"tools": [SEARCH_TOOL]}, "AGENT_TOOL"),
        ({"extra_headers": {"x-hanzo-workload": "batch"}}, "BATCH"),
        ({"extra_body": {"workload_class": "agent_tool"}}, "AGENT_TOOL"),
        # The body field is explicit: it wins over the header and over the tools.
        ({"tools": [SEARCH_TOOL], "extra_body": {"workload_class": "realtime_chat"},
          "extra_headers": {"x-hanzo-workload": "batch"}}, "REALTIME_CHAT"),
        ({}, "REALTIME_CHAT"),
    ]  # fmt: skip
    for fields, expected in cases:
        before = requests_counted(registry, "Chat", expected)
        tool_turn = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "sea"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "The sea is salty."}]  # fmt: skip
        messages = tool_turn if "tools" in fields else MESSAGES
        reply = await client.chat.completions.create(
            model="llama", messages=messages, temperature=0.0, max_tokens=2, **fields
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert requests_counted(registry, "Chat", expected) == before + 1, (fields, expected)


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "search"}}],
    ids=["required", "named"],
)
async def test_a_forced_tool_call_comes_back_as_tool_calls_plain_and_streamed(
    mesh: Mesh, tool_choice: object
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    client = sdk(mesh)
    # A random-weight model: its string arguments are held short so that the call ends within the budget.
    short = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 6}}, "required": ["q"]}
    search = {"type": "function", "function": {"name": "search", "parameters": short}}
    other = {
        "type": "function",
        "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}},
    }
    fields = {"tools": [search, other], "tool_choice": tool_choice, "temperature": 0.0, "max_tokens": 60}
    reply = await client.chat.completions.create(model="llama", messages=MESSAGES, **fields)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    if tool_choice != "required":
        assert call.function.name == "search"
    schema = {"search": search, "clock": other}[call.function.name]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)

    stream = await client.chat.completions.create(model="llama", messages=MESSAGES, stream=True, **fields)
    chunks = [c async for c in stream]
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [
        (0, call.function.name, call.function.arguments)
    ]  # greedy: the same call, in one delta
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_an_auto_tool_reply_without_calls_streams_as_content(mesh: Mesh) -> None:
    # Random weights write no <tool_call>: the reply is content, streamed token by token, not held whole.
    fields = {
        "tools": [SEARCH_TOOL],
        "temperature": 0.0,
        "max_tokens": 12,
        "extra_body": {"ignore_eos": True},
    }
    client = sdk(mesh)
    reply = await client.chat.completions.create(model="llama", messages=MESSAGES, **fields)
    stream = await client.chat.completions.create(model="llama", messages=MESSAGES, stream=True, **fields)
    texts = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == reply.choices[0].message.content and len(texts) > 1
    assert reply.choices[0].finish_reason == "length" and not reply.choices[0].message.tool_calls


async def test_completions_text_and_token_ids_match_grpc(mesh: Mesh) -> None:
    client = sdk(mesh)
    budget = {"temperature": 0.0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
    texts = []
    for prompt in ("Once upon a time", [5, 17, 42, 99, 7]):
        grpc_input = {"prompt": prompt} if isinstance(prompt, str) else {
            "prompt_token_ids": inference_pb2.TokenIds(ids=prompt)}  # fmt: skip
        request = inference_pb2.GenerateRequest(
            model="llama",
            sampling=inference_pb2.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
            **grpc_input,  # type: ignore[arg-type]
        )  # fmt: skip
        reference = [r async for r in mesh.inference.Generate(request, metadata=AUTH)]
        expected = "".join(r.text for r in reference)

        plain = await client.completions.create(model="llama", prompt=prompt, **budget)
        assert plain.id.startswith("cmpl-") and plain.object == "text_completion"
        assert plain.choices[0].text == expected and plain.choices[0].finish_reason == "length"
        assert plain.usage.completion_tokens == 12
        assert plain.usage.prompt_tokens == reference[-1].usage.prompt_tokens

        stream = await client.completions.create(
            model="llama", prompt=prompt, stream=True, stream_options={"include_usage": True}, **budget
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
        texts.append(expected)
    one_in_a_list = await client.completions.create(model="llama", prompt=["Once upon a time"], **budget)
    assert one_in_a_list.choices[0].text == texts[0]


async def test_stop_reason_names_the_stop_string_or_token(mesh: Mesh) -> None:
    client = sdk(mesh)
    prompt = [5, 17, 42, 99, 7]
    budget = {"temperature": 0.0, "max_tokens": 12}
    free = await client.completions.create(
        model="llama", prompt=prompt, **budget, extra_body={"ignore_eos": True}
    )
    sampling = inference_pb2.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    request = inference_pb2.GenerateRequest(
        model="llama", prompt_token_ids=inference_pb2.TokenIds(ids=prompt), sampling=sampling
    )
    tokens = [t async for r in mesh.inference.Generate(request, metadata=AUTH) for t in r.token_ids]
    stop = free.choices[0].text[3:6]
    by_string = await client.completions.create(model="llama", prompt=prompt, stop=[stop], **budget)
    assert by_string.choices[0].finish_reason == "stop" and by_string.choices[0].stop_reason == stop
    by_token = await client.completions.create(
        model="llama", prompt=prompt, **budget, extra_body={"stop_token_ids": [tokens[2]], "ignore_eos": True}
    )
    assert by_token.choices[0].stop_reason == tokens[2]
    stream = await client.completions.create(model="llama", prompt=prompt, stop=[stop], stream=True, **budget)
    last = [c async for c in stream][-1]
    assert last.choices[0].finish_reason == "stop" and last.choices[0].stop_reason == stop
    assert free.choices[0].stop_reason is None  # max_tokens ended it


@pytest.mark.parametrize(
    ("controls", "grpc_controls"),
    [
        ({"logit_bias": {"42": 100}}, {}),  # a +100 bias outweighs every logit: only token 42 follows
        ({"frequency_penalty": 2.0, "presence_penalty": 1.5, "logit_bias": {"42": 100}},
         {"frequency_penalty": 2.0, "presence_penalty": 1.5}),
        ({"extra_body": {"ignore_eos": True, "repetition_penalty": 1.8, "min_p": 0.2}},
         {"repetition_penalty": 1.8, "min_p": 0.2}),
    ],
)  # fmt: skip
async def test_logit_controls_reach_the_engine_from_both_apis(
    mesh: Mesh, controls: dict, grpc_controls: dict
) -> None:
    prompt = [5, 17, 42, 99, 7]
    sampling = inference_pb2.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, **grpc_controls)
    for token, bias in controls.get("logit_bias", {}).items():
        sampling.logit_bias[int(token)] = bias
    request = inference_pb2.GenerateRequest(
        model="llama", sampling=sampling, prompt_token_ids=inference_pb2.TokenIds(ids=prompt)
    )
    reference = [r async for r in mesh.inference.Generate(request, metadata=AUTH)]
    tokens = [t for r in reference for t in r.token_ids]
    plain_request = inference_pb2.GenerateRequest(
        model="llama", sampling=inference_pb2.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
        prompt_token_ids=inference_pb2.TokenIds(ids=prompt),
    )  # fmt: skip
    plain = [t async for r in mesh.inference.Generate(plain_request, metadata=AUTH) for t in r.token_ids]
    if controls.get("logit_bias"):
        assert tokens != plain  # the controls changed the answer
    if controls.get("logit_bias") and not grpc_controls:
        assert tokens == [42] * 6
    # (This prompt's greedy answer repeats no token, so the third case changes nothing here; the engine's
    # tests hold the repetition penalty to transformers' on answers it does change.)
    fields = {"extra_body": {"ignore_eos": True}, **controls}
    reply = await sdk(mesh).completions.create(
        model="llama", prompt=prompt, temperature=0.0, max_tokens=6, **fields
    )
    assert reply.choices[0].text == "".join(r.text for r in reference)


async def test_embeddings_equal_grpc_embed(mesh: Mesh) -> None:
    texts = ["a red apple", "a green pear", "the sea"]
    reference = await mesh.inference.Embed(
        inference_pb2.EmbedRequest(model="minilm", inputs=texts), metadata=AUTH
    )
    expected = [list(e.values) for e in reference.data]
    client = sdk(mesh)
    as_floats = await client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    assert [d.embedding for d in as_floats.data] == expected
    assert [d.index for d in as_floats.data] == [0, 1, 2] and as_floats.model == "minilm"
    assert as_floats.usage.prompt_tokens == reference.usage.prompt_tokens == as_floats.usage.total_tokens
    as_base64 = await client.embeddings.create(model="minilm", input=texts)  # the SDK asks for base64
    np.testing.assert_array_equal(np.array([d.embedding for d in as_base64.data], dtype=np.float32), expected)
    single = await client.embeddings.create(model="minilm", input="the sea", encoding_format="float")
    np.testing.assert_allclose(single.data[0].embedding, expected[2], atol=1e-6)


async def test_http_requests_are_traced_through_to_the_worker(mesh: Mesh) -> None:
    client = sdk(mesh)
    for stream in (False, True):
        mesh.spans.clear()
        reply = await client.completions.create(model="llama", prompt="trace me", max_tokens=3, stream=stream)
        if stream:
            _ = [c async for c in reply]  # type: ignore[union-attr]
        spans = mesh.spans.get_finished_spans()
        server = next(s for s in spans if s.name == "POST /v1/completions" and s.kind.name == "SERVER")
        # OpenTelemetry's ASGI instrumentation: http.status_code until OTEL_SEMCONV_STABILITY_OPT_IN=http
        assert (
            server.attributes.get("http.response.status_code", server.attributes.get("http.status_code"))
            == 200
        )
        in_trace = {(s.resource.attributes["service.name"], s.name) for s in spans
                    if s.context.trace_id == server.context.trace_id}  # fmt: skip
        assert ("hanzo-worker", "decode") in in_trace  # the HTTP span's trace reaches the worker
        assert ("hanzo-placer", "/hanzo.inference.v1.Placer/Pick") in in_trace
