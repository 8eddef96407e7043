"""End to end through the gateway: streamed generation equal to the engine's own, embeddings, model
listing, classification, every status code, cancellation freeing KV, and one trace per request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from hanzo.inference.v1 import common_pb2, inference_pb2, worker_pb2
from services.common.redis_server import RedisServer
from services.common.retry_info import retry_after_of
from services.worker.engine import LLM, SamplingParams
from services.worker.engine.embedding import EmbeddingEngine
from services.worker.server.config import parse_class_policies
from tests.mesh_e2e.conftest import AUTH, Mesh, running_mesh
from tests.placer.cluster_helpers import eventually

GREEDY = inference_pb2.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def generate(prompt: str, **fields: object) -> inference_pb2.GenerateRequest:
    fields.setdefault("sampling", GREEDY)
    return inference_pb2.GenerateRequest(model="llama", prompt=prompt, **fields)  # type: ignore[arg-type]


async def collect(mesh: Mesh, request: inference_pb2.GenerateRequest, metadata: tuple = AUTH) -> list:
    return [r async for r in mesh.inference.Generate(request, metadata=metadata)]


async def test_streamed_generation_equals_the_engine(mesh: Mesh) -> None:
    prompts = ["Once upon a time", "The quick brown fox jumps over", "Paged attention"]
    streams = await asyncio.gather(*(collect(mesh, generate(p)) for p in prompts))
    expected = LLM(mesh.model_dirs["llama"]).generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    )
    for responses, ref in zip(streams, expected, strict=True):
        first, last = responses[0], responses[-1]
        assert (
            first.node_id in {"w1", "w2"} and first.workload_class == common_pb2.WORKLOAD_CLASS_REALTIME_CHAT
        )
        assert [t for r in responses for t in r.token_ids] == ref.token_ids
        assert "".join(r.text for r in responses) == ref.text
        assert last.finish_reason == inference_pb2.FINISH_REASON_LENGTH
        assert last.usage.completion_tokens == 12 and last.usage.prompt_tokens == len(ref.prompt_token_ids)


async def test_embed_and_list_models(mesh: Mesh) -> None:
    texts = ["a red apple", "a green pear"]
    reply = await mesh.inference.Embed(
        inference_pb2.EmbedRequest(model="minilm", inputs=texts), metadata=AUTH
    )
    ours = np.array([e.values for e in reply.data], dtype=np.float32)
    reference = EmbeddingEngine(mesh.model_dirs["minilm"])
    try:
        np.testing.assert_allclose(ours, reference.encode(texts), atol=1e-5)
    finally:
        reference.close()
    assert reply.node_id in {"w1", "w2"} and reply.usage.prompt_tokens > 0
    listed = await mesh.inference.ListModels(inference_pb2.ListModelsRequest(), metadata=AUTH)
    assert [(m.name, m.kind, m.replicas) for m in listed.models] == [
        ("llama", "generate", 2),
        ("minilm", "embed", 2),
    ]


@pytest.mark.parametrize(
    ("request_fields", "metadata", "expected"),
    [
        ({"workload_class": common_pb2.WORKLOAD_CLASS_BATCH}, (), common_pb2.WORKLOAD_CLASS_BATCH),
        ({}, (("x-hanzo-workload", "agent_tool"),), common_pb2.WORKLOAD_CLASS_AGENT_TOOL),
        # The explicit field wins over the metadata.
        ({"workload_class": common_pb2.WORKLOAD_CLASS_BATCH}, (("x-hanzo-workload", "agent_tool"),),
         common_pb2.WORKLOAD_CLASS_BATCH),
        ({"prompt": '<tool_call>{"name": "search"}'}, (), common_pb2.WORKLOAD_CLASS_AGENT_TOOL),
        # A large output budget marks a document job (the tiny test model has no room for a long prompt).
        ({"sampling": inference_pb2.SamplingParams(max_tokens=4096)}, (), common_pb2.WORKLOAD_CLASS_BATCH),
        ({}, (), common_pb2.WORKLOAD_CLASS_REALTIME_CHAT),
    ],
)  # fmt: skip
async def test_each_workload_class_is_assigned_and_reported(
    mesh: Mesh, request_fields: dict, metadata: tuple, expected: int
) -> None:
    request = generate(request_fields.pop("prompt", "Hello"), **request_fields)
    call = mesh.inference.Generate(request, metadata=AUTH + metadata)
    first = await call.read()
    call.cancel()
    assert first.workload_class == expected


@pytest.mark.parametrize(
    ("call", "code", "words"),
    [
        ("no_key", grpc.StatusCode.UNAUTHENTICATED, "authorization"),
        ("bad_key", grpc.StatusCode.UNAUTHENTICATED, "unknown API key"),
        ("empty_model", grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ("no_prompt", grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
        ("bad_top_p", grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
        ("bad_workload", grpc.StatusCode.INVALID_ARGUMENT, "x-hanzo-workload"),
        ("prompt_too_long", grpc.StatusCode.INVALID_ARGUMENT, "no room to generate"),
        ("unknown_model", grpc.StatusCode.NOT_FOUND, "gpt-9"),
        ("embed_with_decoder", grpc.StatusCode.INVALID_ARGUMENT, "generates text"),
        ("deadline", grpc.StatusCode.DEADLINE_EXCEEDED, ""),
    ],
)
async def test_status_codes(mesh: Mesh, call: str, code: grpc.StatusCode, words: str) -> None:
    long_run = inference_pb2.SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True)
    calls = {
        "no_key": lambda: collect(mesh, generate("hi"), ()),
        "bad_key": lambda: collect(mesh, generate("hi"), (("authorization", "Bearer nope"),)),
        "empty_model": lambda: collect(mesh, inference_pb2.GenerateRequest(prompt="hi")),
        "no_prompt": lambda: collect(mesh, inference_pb2.GenerateRequest(model="llama")),
        "bad_top_p": lambda: collect(mesh, generate("hi", sampling=inference_pb2.SamplingParams(top_p=1.5))),
        "bad_workload": lambda: collect(mesh, generate("hi"), (*AUTH, ("x-hanzo-workload", "urgent"))),
        "prompt_too_long": lambda: collect(
            mesh,
            inference_pb2.GenerateRequest(
                model="llama", prompt_token_ids=inference_pb2.TokenIds(ids=[5] * 1100), sampling=GREEDY
            ),
        ),
        "unknown_model": lambda: collect(mesh, inference_pb2.GenerateRequest(model="gpt-9", prompt="hi")),
        "embed_with_decoder": lambda: mesh.inference.Embed(
            inference_pb2.EmbedRequest(model="llama", inputs=["x"]), metadata=AUTH
        ),
        "deadline": lambda: _with_deadline(mesh, generate("hi", sampling=long_run), 0.3),
    }
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await calls[call]()
    assert err.value.code() == code, err.value.details()
    assert words in (err.value.details() or "")


async def _with_deadline(mesh: Mesh, request: inference_pb2.GenerateRequest, timeout_s: float) -> list:
    return [r async for r in mesh.inference.Generate(request, metadata=AUTH, timeout=timeout_s)]


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_waiting": 0},  # the worker's own queue limit
        {"class_policies": parse_class_policies('{"BATCH": {"max_waiting": 0}}', "test")},  # the engine's
    ],
    ids=["worker_max_waiting", "engine_class_queue"],
)
async def test_overloaded_workers_answer_resource_exhausted(redis_server, model_dirs, overrides) -> None:
    async with running_mesh(redis_server.url, {"llama": model_dirs["llama"]}, **overrides) as mesh:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(mesh, generate("hi", workload_class=common_pb2.WORKLOAD_CLASS_BATCH))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "every worker tried is overloaded" in err.value.details()
        # The worker's delay reaches the caller as google.rpc.RetryInfo, read the way any client reads it.
        status = rpc_status.from_call(err.value)
        assert status is not None and status.details[0].Is(error_details_pb2.RetryInfo.DESCRIPTOR)
        delay = retry_after_of(err.value)
        assert delay is not None and delay > 0, delay
        labels = {"model_name": "llama", "workload_class": "BATCH", "reason": "queue_full"}
        for worker in mesh.workers:  # the gateway moved the refused request on to the other worker
            registry = worker.metrics.registry
            assert registry.get_sample_value("hanzo_worker_requests_rejected_total", labels) == 1


async def test_cancelled_stream_frees_the_workers_kv(mesh: Mesh) -> None:
    long_run = inference_pb2.SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True)
    call = mesh.inference.Generate(generate("tell me everything", sampling=long_run), metadata=AUTH)
    first = await call.read()
    worker = next(w for w in mesh.workers if w.node_id == first.node_id)
    stats = worker.servicer.stats
    assert stats().models[0].kv_blocks_used > 0
    call.cancel()

    async def freed() -> bool:
        return all(m.kv_blocks_used == 0 and m.running == 0 for m in stats().models)

    await eventually(freed, 10, "the worker's KV back to idle after the caller cancelled")
    assert worker.host.models["llama"].llm.engine.stats.generated_tokens < 900


async def test_one_trace_spans_gateway_placer_and_worker(mesh: Mesh) -> None:
    mesh.spans.clear()
    await collect(mesh, generate("trace me"))
    spans = mesh.spans.get_finished_spans()
    gateway_span = next(s for s in spans if s.name.endswith("Inference/Generate") and s.kind.name == "SERVER")
    trace_id = gateway_span.context.trace_id
    in_trace = [s for s in spans if s.context.trace_id == trace_id]
    services = {s.resource.attributes["service.name"] for s in in_trace}
    assert services == {"hanzo-gateway", "hanzo-placer", "hanzo-worker"}
    names = {s.name for s in in_trace}
    assert {"classify", "queue", "prefill", "decode"} <= names
    assert any(n.endswith("Placer/Pick") for n in names) and any(n.endswith("Worker/Generate") for n in names)
    worker_span = next(s for s in in_trace if s.name.endswith("Worker/Generate") and s.kind.name == "SERVER")
    assert worker_span.attributes["gen_ai.request.model"] == "llama"
    assert worker_span.attributes["gen_ai.usage.output_tokens"] == 12


async def test_worker_stats_over_grpc(mesh: Mesh) -> None:
    from hanzo.inference.v1 import worker_pb2_grpc

    async with grpc.aio.insecure_channel(mesh.workers[0].address) as channel:
        stats = await worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.GetStatsRequest())
    assert {m.name for m in stats.models} == {"llama", "minilm"}


async def test_embedded_placement_picks_in_process(
    redis_server: RedisServer, model_dirs: dict[str, Path]
) -> None:
    async with running_mesh(redis_server.url, model_dirs, placement="embedded") as mesh:
        mesh.spans.clear()
        responses = await collect(mesh, generate("Once upon a time"))
        expected = LLM(mesh.model_dirs["llama"]).generate(
            ["Once upon a time"], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        )[0]
        assert [t for r in responses for t in r.token_ids] == expected.token_ids
        assert responses[0].node_id in {"w1", "w2"}
        names = {(s.resource.attributes["service.name"], s.name) for s in mesh.spans.get_finished_spans()}
        assert ("hanzo-gateway", "pick") in names
        assert not any(name.endswith("Placer/Pick") for _, name in names)  # no network hop to a placer
        listed = await mesh.inference.ListModels(inference_pb2.ListModelsRequest(), metadata=AUTH)
        assert {m.name for m in listed.models} == {"llama", "minilm"}
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(mesh, inference_pb2.GenerateRequest(model="gpt-9", prompt="hi"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("method", "message", "code", "words"),
    [
        ("LoadModel", worker_pb2.LoadModelRequest(model=""), grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ("LoadModel", worker_pb2.LoadModelRequest(model="nope"), grpc.StatusCode.NOT_FOUND, "catalog"),
        ("EvictModel", worker_pb2.EvictModelRequest(model=""), grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ("EvictModel", worker_pb2.EvictModelRequest(model="nope"), grpc.StatusCode.NOT_FOUND, "not resident"),
    ],
)
async def test_worker_model_lifecycle_errors(
    mesh: Mesh, method: str, message: object, code: grpc.StatusCode, words: str
) -> None:
    from hanzo.inference.v1 import worker_pb2_grpc

    async with grpc.aio.insecure_channel(mesh.workers[0].address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await getattr(stub, method)(message)
        assert err.value.code() == code and words in err.value.details()
        # The resident models keep serving.
        stats = await stub.GetStats(worker_pb2.GetStatsRequest())
    assert {m.name for m in stats.models} == {"llama", "minilm"}
