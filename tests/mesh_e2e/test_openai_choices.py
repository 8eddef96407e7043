"""Logprobs and n through the official `openai` SDK against a real mesh: chat's and the legacy
completions' logprobs shapes, plain and streamed alike and equal to what gRPC returns; n choices with a
seed each, their prompt computed once, streamed by index with the usage summed; a client leaving an n
stream frees every choice's KV."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from hanzo.inference.v1 import inference_pb2
from services.common.redis_server import RedisServer
from tests.mesh_e2e.conftest import AUTH, Mesh
from tests.mesh_e2e.http_helpers import MESSAGES, http, kv_idle, sdk, shared_mesh
from tests.worker.engine.reference import mixed_prompts

pytestmark = pytest.mark.asyncio(loop_scope="module")
GREEDY = {"temperature": 0.0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(module_redis: RedisServer, llama_gqa_dir: Path) -> AsyncIterator[Mesh]:
    async with shared_mesh(module_redis.url, {"llama": llama_gqa_dir}) as running:
        yield running


async def test_chat_logprobs_plain_streamed_and_over_grpc_agree(mesh: Mesh) -> None:
    client = sdk(mesh)
    plain = await client.chat.completions.create(
        model="llama", messages=MESSAGES, logprobs=True, top_logprobs=3, **GREEDY
    )
    content = plain.choices[0].logprobs.content
    assert len(content) == plain.usage.completion_tokens == 8
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0.0
        assert entry.bytes == list(entry.token.encode())
        # Greedy: the token is the likeliest, so it heads the alternatives with the same logprob.
        assert (entry.token, entry.logprob) == (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob)
        values = [top.logprob for top in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
    streamed = await client.chat.completions.create(
        model="llama", messages=MESSAGES, logprobs=True, top_logprobs=3, stream=True, **GREEDY
    )
    streamed_content = [e async for chunk in streamed if chunk.choices and chunk.choices[0].logprobs
                        for e in chunk.choices[0].logprobs.content]  # fmt: skip
    assert [e.token for e in streamed_content] == [e.token for e in content]
    assert [e.logprob for e in streamed_content] == pytest.approx([e.logprob for e in content], abs=1e-4)
    request = inference_pb2.ChatRequest(
        model="llama",
        messages=[inference_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in MESSAGES],
        sampling=inference_pb2.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3),
    )
    entries = [e async for r in mesh.inference.Chat(request, metadata=AUTH) for e in r.logprobs]
    assert [e.token for e in entries] == [e.token for e in content]
    assert [e.rank for e in entries] == [1] * 8
    assert [e.logprob for e in entries] == pytest.approx([e.logprob for e in content], abs=1e-4)


async def test_completion_logprobs_in_the_legacy_shape(mesh: Mesh) -> None:
    client = sdk(mesh)
    fields = {"model": "llama", "prompt": "Once upon a time", "logprobs": 2, "max_tokens": 6,
              "temperature": 0.8, "seed": 5, "extra_body": {"ignore_eos": True}}  # fmt: skip
    plain = await client.completions.create(**fields)
    logprobs = plain.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 6
    offset = 0
    for token, value, top, at in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs,
                                     logprobs.text_offset, strict=True):  # fmt: skip
        assert top[token] == value and 2 <= len(top) <= 3  # the alternatives and the sampled token
        assert at == offset
        offset += len(token)
    assert "".join(logprobs.tokens) == plain.choices[0].text
    streamed = await client.completions.create(stream=True, **fields)
    tokens, offsets = [], []
    async for chunk in streamed:
        if chunk.choices and chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            offsets += chunk.choices[0].logprobs.text_offset
    assert (tokens, offsets) == (logprobs.tokens, logprobs.text_offset)


async def test_n_choices_each_seeded_with_the_prompt_computed_once(mesh: Mesh) -> None:
    prompt = mixed_prompts(1, 512, seed=77, lengths=[100])[0]  # six full blocks of 16, 4 tokens more
    fields = {"model": "llama", "prompt": prompt, "n": 3, "max_tokens": 8, "temperature": 1.0, "seed": 9,
              "extra_body": {"ignore_eos": True}}  # fmt: skip
    client = sdk(mesh)
    reply = await client.completions.create(**fields)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.text for c in reply.choices}) == 3  # seed, seed + 1, seed + 2
    assert reply.usage.prompt_tokens == 100 and reply.usage.completion_tokens == 24
    assert reply.usage.prompt_tokens_details.cached_tokens == 96  # the later choices' prompt hits
    for i, choice in enumerate(reply.choices):  # choice i samples as one request with seed + i
        alone = await client.completions.create(**{**fields, "n": 1, "seed": 9 + i})
        assert alone.choices[0].text == choice.text
    responses = [
        r
        async for r in mesh.inference.Generate(
            inference_pb2.GenerateRequest(
                model="llama",
                prompt_token_ids=inference_pb2.TokenIds(ids=prompt),
                sampling=inference_pb2.SamplingParams(
                    max_tokens=8, temperature=1.0, seed=9, ignore_eos=True, n=3
                ),
            ),
            metadata=AUTH,
        )
    ]
    by_index: dict[int, list[int]] = {}
    for r in responses:
        by_index.setdefault(r.index, []).extend(r.token_ids)
    assert sorted(by_index) == [0, 1, 2] and all(len(t) == 8 for t in by_index.values())
    assert sum(1 for r in responses if r.finish_reason) == 3  # each choice ends with its own last message


async def test_n_chat_streamed_by_index_with_the_usage_summed(mesh: Mesh) -> None:
    client = sdk(mesh)
    plain = await client.chat.completions.create(model="llama", messages=MESSAGES, n=2, **GREEDY)
    assert [c.message.content for c in plain.choices] == [plain.choices[0].message.content] * 2  # greedy
    stream = await client.chat.completions.create(
        model="llama", messages=MESSAGES, n=2, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    text: dict[int, str] = {}
    roles: dict[int, str] = {}
    finished: dict[int, str] = {}
    usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text[choice.index] = text.get(choice.index, "") + (choice.delta.content or "")
            if choice.delta.role:
                roles[choice.index] = choice.delta.role
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert roles == {0: "assistant", 1: "assistant"} and finished == {0: "length", 1: "length"}
    assert text == {i: c.message.content for i, c in enumerate(plain.choices)}
    assert usage is not None and usage.completion_tokens == 16
    assert usage.prompt_tokens == plain.usage.prompt_tokens


async def test_a_client_leaving_an_n_stream_frees_every_choice(mesh: Mesh) -> None:
    body = {"model": "llama", "messages": MESSAGES, "n": 3, "stream": True, "max_tokens": 900,
            "temperature": 0.0, "ignore_eos": True}  # fmt: skip
    async with http(mesh) as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        seen: set[int] = set()  # choices that have sent text
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[len("data: ") :])["choices"][0]
                if choice["delta"].get("content"):
                    seen.add(choice["index"])
            if len(seen) == 3:
                break
    assert seen == {0, 1, 2}
    await kv_idle(mesh, "every choice's KV freed after the client left")
