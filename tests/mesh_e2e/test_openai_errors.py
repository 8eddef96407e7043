"""Every error of the HTTP front through the `openai` SDK's exception types (with the param named),
the error JSON shape and the SSE framing read raw with httpx, deadlines (504, and an error after the
stream began), and a client that disconnects mid-stream freeing the worker's KV blocks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import pytest_asyncio

from services.common.redis_server import RedisServer
from tests.mesh_e2e.conftest import Mesh
from tests.mesh_e2e.http_helpers import MESSAGES, chunks_of, http, kv_idle, sdk, shared_mesh, sse_data

pytestmark = pytest.mark.asyncio(loop_scope="module")
BODY_LIMIT = 100_000
LONG = {"max_tokens": 900, "temperature": 0.0, "ignore_eos": True}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(module_redis: RedisServer, llama_gqa_dir: Path, minilm_dir: Path, no_template_dir: Path
               ) -> AsyncIterator[Mesh]:  # fmt: skip
    models = {"llama": llama_gqa_dir, "minilm": minilm_dir, "plain": no_template_dir}
    async with shared_mesh(module_redis.url, models, http_max_body_bytes=BODY_LIMIT) as running:
        yield running


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "llama", "messages": MESSAGES, "max_tokens": 4, **fields}


@pytest.mark.parametrize(
    ("route", "body", "param", "code"),
    [
        ("chat", chat(n=17), "n", None),
        ("chat", chat(n=0), "n", None),
        ("chat", chat(top_logprobs=3), "top_logprobs", None),  # without logprobs=true
        ("chat", chat(logprobs=True, top_logprobs=21), "top_logprobs", None),
        ("completions", {"model": "llama", "prompt": "hi", "logprobs": 21}, "logprobs", None),
        ("completions", {"model": "llama", "prompt": "hi", "n": 99}, "n", None),
        ("chat", chat(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role", None),
        ("chat", chat(messages=[]), "messages", None),
        ("chat", chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
         "messages[0].content[0].type", None),
        ("chat", chat(temperature="hot"), "temperature", None),
        ("chat", chat(top_p=1.5), "top_p", None),
        ("chat", chat(max_tokens=0), "max_tokens", None),
        ("chat", chat(min_tokens=9, max_tokens=4), "min_tokens", None),
        ("chat", chat(presence_penalty=2.5), "presence_penalty", None),
        ("chat", chat(frequency_penalty=-3), "frequency_penalty", None),
        ("chat", chat(repetition_penalty=0), "repetition_penalty", None),
        ("chat", chat(min_p=1.5), "min_p", None),
        ("chat", chat(logit_bias={"fifty": 1}), "logit_bias", None),
        ("chat", chat(logit_bias={"5": 101}), "logit_bias", None),
        ("completions", {"model": "llama", "prompt": "hi", "logit_bias": {"999999": 1}}, "logit_bias", None),
        ("chat", chat(tool_choice="required"), "tool_choice", None),
        ("chat", chat(response_format={"type": "json_schema"}), "response_format", None),
        ("chat", chat(response_format={"type": "xml"}), "response_format.type", None),
        ("chat", chat(response_format={"type": "json_object"}, guided_regex="a+"), "guided_regex", None),
        ("chat", chat(guided_regex="(unclosed"), "response_format", None),  # the worker's compiler
        ("chat", chat(guided_json={"type": "no-such-type"}), "response_format", None),
        ("chat", chat(guided_choice=[]), "response_format", None),
        ("chat", chat(stream_options={"include_usage": True}), "stream_options", None),
        ("chat", chat(workload_class="urgent"), "workload_class", None),
        ("chat", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "not an object"}}]),
         "tools[0].function.parameters", None),
        ("chat", chat(messages=[{"role": "user", "content": "word " * 1500}]), "messages",
         "context_length_exceeded"),
        ("chat", chat(model="plain"), None, "unsupported_model"),  # no chat template: FAILED_PRECONDITION
        ("completions", {"model": "llama", "prompt": ["one", "two"]}, "prompt", None),
        ("completions", {"model": "llama", "prompt": [5] * 1100}, "prompt", "context_length_exceeded"),
        ("completions", {"model": "llama", "prompt": [99999]}, "prompt", None),
        ("completions", {"model": "llama", "prompt": "hi", "echo": True}, "echo", None),
        ("embeddings", {"model": "minilm", "input": [[1, 2, 3]]}, "input", None),
        ("embeddings", {"model": "minilm", "input": ["fine", " "]}, "input[1]", None),
        ("embeddings", {"model": "llama", "input": "a decoder does not embed"}, "model", None),
    ],
)  # fmt: skip
async def test_bad_requests_are_400_naming_the_param(
    mesh: Mesh, route: str, body: dict[str, Any], param: str | None, code: str | None
) -> None:
    path = {"chat": "/chat/completions", "completions": "/completions", "embeddings": "/embeddings"}[route]
    with pytest.raises(openai.BadRequestError) as err:  # the SDK's own post: bodies it would not build
        await sdk(mesh).post(path, body=body, cast_to=httpx2.Response)
    assert err.value.status_code == 400 and err.value.type == "invalid_request_error"
    assert err.value.param == param and err.value.code == code, err.value.message


async def test_authentication(mesh: Mesh) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        await sdk(mesh, api_key="nope").chat.completions.create(model="llama", messages=MESSAGES)
    assert "unknown API key" in err.value.message and err.value.code == "invalid_api_key"
    async with http(mesh, headers={}) as client:
        reply = await client.post("/v1/chat/completions", json=chat())
        models = await client.get("/v1/models")
        health = await client.get("/health")  # probes need no key
    assert reply.status_code == models.status_code == 401
    assert set(reply.json()) == {"error"} and set(reply.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    assert reply.json()["error"]["type"] == "authentication_error"
    assert health.status_code == 200


async def test_unknown_model_is_404(mesh: Mesh) -> None:
    client = sdk(mesh)
    for create in (
        lambda: client.chat.completions.create(model="gpt-9", messages=MESSAGES),
        lambda: client.chat.completions.create(
            model="gpt-9", messages=MESSAGES, stream=True
        ),  # before it starts
        lambda: client.completions.create(model="gpt-9", prompt="hi"),
        lambda: client.embeddings.create(model="gpt-9", input="hi"),
        lambda: client.models.retrieve("gpt-9"),
    ):
        with pytest.raises(openai.NotFoundError) as err:
            await create()
        assert err.value.param == "model" and err.value.code == "model_not_found"


async def test_raw_error_shapes_and_limits(mesh: Mesh) -> None:
    async with http(mesh) as client:
        not_json = await client.post(
            "/v1/completions", content=b"{nope", headers={"content-type": "application/json"}
        )
        too_large = await client.post("/v1/completions", json={"model": "llama", "prompt": "x" * BODY_LIMIT})
        no_route = await client.post("/v1/edits", json={})
        bad_timeout = await client.post("/v1/completions", json={"model": "llama", "prompt": "hi"},
                                         headers={"timeout": "soon"})  # fmt: skip
        metrics = await client.get("/metrics")
    for reply, status in ((not_json, 400), (too_large, 413), (no_route, 404), (bad_timeout, 400)):
        assert reply.status_code == status, reply.text
        assert reply.headers["content-type"] == "application/json"
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert bad_timeout.json()["error"]["param"] == "timeout"
    assert 'hanzo_gateway_http_responses_total{route="/v1/completions",status="413"}' in metrics.text


async def test_sse_framing(mesh: Mesh) -> None:
    body = {"model": "llama", "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    async with http(mesh) as client:
        reply = await client.post("/v1/completions", json=body, headers={"x-request-id": "mine-1"})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    assert reply.headers["x-request-id"] == "mine-1"  # echoed
    chunks = chunks_of(sse_data(reply.text))
    *deltas, usage = chunks
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and chunks[0]["id"].startswith("cmpl-")
    assert all(c["object"] == "text_completion" and c["model"] == "llama" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in deltas] == [None] * (len(deltas) - 1) + ["length"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5

    async with http(mesh) as client:
        reply = await client.post("/v1/chat/completions", json=chat(stream=True, temperature=0.0))
    chunks = chunks_of(sse_data(reply.text))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["object"] == "chat.completion.chunk" and "usage" not in chunks[-1]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


async def test_deadlines_end_with_504(mesh: Mesh) -> None:
    client = sdk(mesh)
    with pytest.raises(openai.APIStatusError) as err:
        await client.completions.create(model="llama", prompt="go on", extra_body=LONG,
                                        extra_headers={"timeout": "0.3"})  # fmt: skip
    assert err.value.status_code == 504 and err.value.code == "timeout"
    with pytest.raises(openai.APIStatusError) as err:
        await client.chat.completions.create(model="llama", messages=MESSAGES, extra_body=LONG,
                                             extra_headers={"timeout": "0.3"})  # fmt: skip
    assert err.value.status_code == 504
    await kv_idle(mesh, "the timed-out requests' KV freed")


async def test_an_error_after_the_stream_began_is_an_sse_event(mesh: Mesh) -> None:
    body = {"model": "llama", "prompt": "go on", "stream": True, **LONG}
    async with http(mesh) as client:
        reply = await client.post("/v1/completions", json=body, headers={"timeout": "0.6"})
    assert reply.status_code == 200  # the first token came in time; the rest did not
    data = sse_data(reply.text)
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])
    assert set(error) == {"error"} and error["error"]["code"] == "timeout", error
    assert all("choices" in json.loads(d) for d in data[:-2])
    await kv_idle(mesh, "the timed-out stream's KV freed")


def generated_tokens(mesh: Mesh) -> int:
    return sum(w.host.models["llama"].llm.engine.stats.generated_tokens for w in mesh.workers)


async def test_disconnect_mid_stream_frees_the_workers_kv(mesh: Mesh) -> None:
    before = generated_tokens(mesh)
    body = {"model": "llama", "prompt": "tell me everything", "stream": True, **LONG}
    async with http(mesh) as client, client.stream("POST", "/v1/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                break  # a token arrived: the worker is generating; now hang up
        assert any(m.kv_blocks_used > 0 for w in mesh.workers for m in w.servicer.stats().models)
    await kv_idle(mesh, "the worker's KV back to idle after the HTTP client hung up")
    assert generated_tokens(mesh) - before < LONG["max_tokens"]  # aborted, not run to its end

    # The SDK closing a chat stream does the same.
    before = generated_tokens(mesh)
    stream = await sdk(mesh).chat.completions.create(
        model="llama", messages=MESSAGES, stream=True, extra_body=LONG
    )
    async for _ in stream:
        break
    await stream.close()
    await kv_idle(mesh, "the worker's KV back to idle after the SDK closed its stream")
    assert generated_tokens(mesh) - before < LONG["max_tokens"]


async def test_disconnect_before_a_plain_reply_frees_the_workers_kv(mesh: Mesh) -> None:
    """A client that gives up on a non-streamed request (its own timeout) cancels it too."""
    before = generated_tokens(mesh)
    with pytest.raises(openai.APITimeoutError):
        await (
            sdk(mesh)
            .with_options(timeout=0.5)
            .completions.create(model="llama", prompt="go", extra_body=LONG)
        )
    await kv_idle(mesh, "the worker's KV back to idle after the client timed out")
    assert generated_tokens(mesh) - before < LONG["max_tokens"]
