"""Per-key rate limits on a real mesh: a key past its burst is refused before any work, over gRPC with
RESOURCE_EXHAUSTED carrying google.rpc.RetryInfo and over HTTP with 429 and Retry-After, while another
key is served; a caller without a valid key is refused for that, and spends nobody's tokens."""

from __future__ import annotations

from pathlib import Path

import grpc
import openai
import pytest
from grpc_status import rpc_status

from hanzo.inference.v1 import inference_pb2
from services.common.redis_server import RedisServer
from services.common.retry_info import retry_after_of
from tests.mesh_e2e.conftest import API_KEY, Mesh, running_mesh
from tests.mesh_e2e.http_helpers import sdk
from tests.placer.cluster_helpers import eventually

OTHER_KEY = "second-key"
# 0.2 tokens a second: the test runs in well under the 5 s a token takes to come back.
LIMITS = {"api_keys": frozenset({API_KEY, OTHER_KEY}), "rate_limit_rps": 0.2, "rate_limit_burst": 2}
REQUEST = inference_pb2.GenerateRequest(
    model="llama", prompt="hi", sampling=inference_pb2.SamplingParams(max_tokens=2, ignore_eos=True)
)


def _auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


async def _generate(mesh: Mesh, key: str) -> list[inference_pb2.GenerateResponse]:
    return [r async for r in mesh.inference.Generate(REQUEST, metadata=_auth(key))]


def _rate_limited(mesh: Mesh) -> float:
    return mesh.gateway.metrics.registry.get_sample_value("hanzo_gateway_rate_limited_total") or 0.0


async def test_a_key_over_its_rate_is_refused_with_retry_info(
    redis_server: RedisServer, llama_gqa_dir: Path
) -> None:
    async with running_mesh(
        redis_server.url, {"llama": llama_gqa_dir}, workers=1, gateway_overrides=LIMITS
    ) as mesh:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await _generate(mesh, "not-a-key")
        assert unknown.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for _ in range(2):  # the burst, untouched by the refused caller above
            assert sum(len(r.token_ids) for r in await _generate(mesh, API_KEY)) == 2
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _generate(mesh, API_KEY)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over its rate limit of 0.2 requests per second (bursts of 2)" in refused.value.details()
        status = rpc_status.from_call(refused.value)  # the rich status, as any gRPC client reads it
        assert status is not None and status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        delay = retry_after_of(refused.value)
        assert delay is not None and 0 < delay <= 5.0, delay
        assert sum(len(r.token_ids) for r in await _generate(mesh, OTHER_KEY)) == 2  # its own bucket

        with pytest.raises(openai.RateLimitError) as http_refused:  # the same bucket on the HTTP front
            await sdk(mesh).completions.create(model="llama", prompt="hi", max_tokens=2)
        assert http_refused.value.status_code == 429 and http_refused.value.code == "rate_limit_exceeded"
        headers = http_refused.value.response.headers
        assert 1 <= int(headers["retry-after"]) <= 5 and 0 < int(headers["retry-after-ms"]) <= 5000
        assert _rate_limited(mesh) == 2

        async def only_admitted_calls_generated() -> bool:  # 3 admitted calls of 2 tokens; nothing else
            registry = mesh.workers[0].metrics.registry
            return (
                registry.get_sample_value("hanzo_worker_generation_tokens_total", {"model_name": "llama"})
                == 6
            )

        await eventually(only_admitted_calls_generated, 5, "the worker generated for the admitted calls only")
