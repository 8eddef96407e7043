"""The HTTP front when the mesh cannot serve: overloaded workers answer 429 with Retry-After (the
worker's own hint), a model no worker can take now answers 503; and a gateway stopping while an HTTP
stream runs lets it finish. Each case runs its own mesh."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest

from services.common.redis_server import RedisServer
from tests.mesh_e2e.conftest import running_mesh
from tests.mesh_e2e.http_helpers import MESSAGES, http, sdk


async def test_overloaded_workers_answer_429_with_retry_after(
    redis_server: RedisServer, llama_gqa_dir: Path
) -> None:
    async with running_mesh(redis_server.url, {"llama": llama_gqa_dir}, max_waiting=0) as mesh:
        client = sdk(mesh)
        for create in (
            lambda: client.completions.create(model="llama", prompt="hi"),
            lambda: client.completions.create(model="llama", prompt="hi", stream=True),  # before it starts
            lambda: client.chat.completions.create(model="llama", messages=MESSAGES),
        ):
            with pytest.raises(openai.RateLimitError) as err:
                await create()
            assert err.value.status_code == 429 and err.value.code == "rate_limit_exceeded"
            assert "every worker tried is overloaded" in err.value.message
            headers = err.value.response.headers
            assert int(headers["retry-after"]) >= 1 and int(headers["retry-after-ms"]) > 0


async def test_no_worker_to_serve_answers_503(redis_server: RedisServer, llama_gqa_dir: Path) -> None:
    async with running_mesh(redis_server.url, {"llama": llama_gqa_dir}, workers=1) as mesh:
        mesh.workers[0].servicer.drain()  # refuses new streams; its next heartbeat says it is draining
        with pytest.raises(openai.InternalServerError) as err:
            await sdk(mesh).completions.create(model="llama", prompt="hi")
        assert err.value.status_code == 503 and err.value.code == "service_unavailable"
        assert err.value.type == "server_error"


async def test_stopping_the_gateway_drains_an_http_stream(
    redis_server: RedisServer, llama_gqa_dir: Path
) -> None:
    async with running_mesh(redis_server.url, {"llama": llama_gqa_dir}, workers=1) as mesh:
        body = {"model": "llama", "prompt": "drain me", "max_tokens": 40, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        stopping = None
        events = []
        async with http(mesh) as client, client.stream("POST", "/v1/completions", json=body) as reply:
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[len("data: ") :])
                if stopping is None:  # graceful stop while the stream runs: it still completes
                    stopping = asyncio.create_task(mesh.gateway.stop())
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 40
        assert stopping is not None
        await stopping
