"""What the gateway counts, read from its registry after real calls: every gRPC call by its final code,
those refused before any pick included (no key, bad input, unknown model), with its handling time and
in-flight gauge back at zero; the HTTP front's in-flight gauge and duration over a whole stream; and
tokens per tenant, the prompt once however many choices."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from hanzo.inference.v1 import inference_pb2
from services.common.redis_server import RedisServer
from tests.mesh_e2e.conftest import AUTH, Mesh
from tests.mesh_e2e.http_helpers import MESSAGES, sdk, shared_mesh
from tests.worker.engine.reference import mixed_prompts

pytestmark = pytest.mark.asyncio(loop_scope="module")
SERVICE = "hanzo.inference.v1.Inference"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(module_redis: RedisServer, llama_gqa_dir: Path) -> AsyncIterator[Mesh]:
    async with shared_mesh(module_redis.url, {"llama": llama_gqa_dir}) as running:
        yield running


def _handled(registry: CollectorRegistry, method: str, code: str) -> float:
    labels = {"grpc_service": SERVICE, "grpc_method": method, "grpc_type": "server_stream", "grpc_code": code}
    return registry.get_sample_value("grpc_server_handled_total", labels) or 0.0


def _generate(**fields: object) -> inference_pb2.GenerateRequest:
    fields.setdefault("model", "llama")
    fields.setdefault("prompt", "hello")
    return inference_pb2.GenerateRequest(sampling=inference_pb2.SamplingParams(max_tokens=3), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "metadata", "code"),
    [
        (_generate(), AUTH, "OK"),
        (_generate(), (), "UNAUTHENTICATED"),
        (_generate(model=""), AUTH, "INVALID_ARGUMENT"),
        (_generate(model="gpt-9"), AUTH, "NOT_FOUND"),
    ],
)
async def test_every_grpc_call_is_counted_by_its_code(
    mesh: Mesh, request_: inference_pb2.GenerateRequest, metadata: tuple, code: str
) -> None:
    registry = mesh.gateway.metrics.registry
    before = _handled(registry, "Generate", code)
    try:
        [r async for r in mesh.inference.Generate(request_, metadata=metadata)]
    except grpc.aio.AioRpcError as err:
        assert err.code().name == code
    assert _handled(registry, "Generate", code) == before + 1
    labels = {"grpc_service": SERVICE, "grpc_method": "Generate", "grpc_type": "server_stream"}
    assert registry.get_sample_value("grpc_server_in_flight", labels) == 0
    assert registry.get_sample_value("grpc_server_handling_seconds_count", labels) >= 1


async def test_an_http_stream_is_in_flight_until_its_end_and_timed_whole(mesh: Mesh) -> None:
    registry = mesh.gateway.metrics.registry
    route = "/v1/chat/completions"
    count = {"route": route, "status": "200"}
    before = registry.get_sample_value("hanzo_gateway_http_request_duration_seconds_count", count) or 0.0
    stream = await sdk(mesh).chat.completions.create(
        model="llama", messages=MESSAGES, max_tokens=4, stream=True
    )
    [_ async for _ in stream]
    assert registry.get_sample_value("hanzo_gateway_http_requests_in_flight", {"route": route}) == 0
    assert registry.get_sample_value("hanzo_gateway_http_request_duration_seconds_count", count) == before + 1


async def test_tokens_are_counted_per_tenant_with_the_prompt_once(mesh: Mesh) -> None:
    registry = mesh.gateway.metrics.registry
    reply = await sdk(mesh).completions.create(
        model="llama", prompt="count me", max_tokens=5, n=3, user="tenant-a", extra_body={"ignore_eos": True}
    )

    def tokens(kind: str) -> float | None:
        return registry.get_sample_value(
            "hanzo_gateway_tenant_tokens_total", {"tenant": "tenant-a", "kind": kind}
        )

    assert tokens("prompt") == reply.usage.prompt_tokens
    assert tokens("generation") == reply.usage.completion_tokens == 15


async def test_the_worker_counts_prefix_cache_queries_and_hits_as_vllm_does(mesh: Mesh) -> None:
    # Two choices of one 100-token prompt on one worker: the second finds the prompt's 96 tokens of full
    # blocks in the cache, so hits / queries (vLLM's hit-rate query) is 96 / 200.
    prompt = mixed_prompts(1, 512, seed=123, lengths=[100])[0]

    def total(name: str, labels: dict[str, str]) -> float:
        return sum(w.metrics.registry.get_sample_value(name, labels) or 0.0 for w in mesh.workers)

    model = {"model_name": "llama"}
    classed = {**model, "workload_class": "BATCH"}
    before = {name: total(name, model) for name in ("hanzo_worker_prefix_cache_queries_total",
                                                    "hanzo_worker_prefix_cache_hits_total")}  # fmt: skip
    counts = ("hanzo_worker_request_prompt_tokens_count", "hanzo_worker_request_prefill_time_seconds_count")
    counted = {name: total(name, classed) for name in counts}
    await sdk(mesh).completions.create(
        model="llama", prompt=prompt, n=2, max_tokens=3, extra_body={"workload_class": "batch"}
    )
    assert total("hanzo_worker_prefix_cache_queries_total", model) - before[
        "hanzo_worker_prefix_cache_queries_total"] == 200  # fmt: skip
    assert total("hanzo_worker_prefix_cache_hits_total", model) - before[
        "hanzo_worker_prefix_cache_hits_total"] == 96  # fmt: skip
    assert all(total(name, classed) == counted[name] + 2 for name in counts)
