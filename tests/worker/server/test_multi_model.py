"""One worker serving two decoders and the MiniLM encoder at once from one arena, over loopback gRPC:
each model's outputs equal serving it alone; lifecycle errors (a corrupt checkpoint, a model too big
for the arena, a model not in the catalog) get precise status codes while the resident models keep
serving; the placer hears about host copies, and a request for an evicted model reloads it from one."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from hanzo.inference.v1 import common_pb2, inference_pb2, worker_pb2, worker_pb2_grpc
from services.common.sampling import SamplingParams
from services.worker.engine.embedding import EmbeddingEngine
from services.worker.engine.llm import LLM
from services.worker.models.synthetic import make_decoder_checkpoint
from services.worker.server.app import WorkerApp
from services.worker.server.config import WorkerSettings
from services.worker.server.heartbeat import node_report
from tests.worker.server.serving import no_placer, serving

SPEC = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_layers": 2}
PROMPTS = [[5, 17, 42], [9, 8, 7, 6, 5, 4, 3], [100, 200, 300, 400], [11] * 20]
TEXTS = ["a cat sat on the mat", "GPU inference at scale", "hello", "the quick brown fox jumps"]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def decoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("multi")
    return {
        "llama-a": make_decoder_checkpoint(root / "a", **SPEC, seed=21),
        "llama-b": make_decoder_checkpoint(root / "b", **SPEC, num_heads=4, num_kv_heads=4, seed=22),
    }


@contextlib.asynccontextmanager
async def running_worker(
    tmp_path: Path, models: dict[str, Path], arena_bytes: int
) -> AsyncIterator[tuple[WorkerApp, worker_pb2_grpc.WorkerStub]]:
    """A worker with no placer (its heartbeats fail quietly against a socket nobody serves)."""
    settings = WorkerSettings(
        port=0, node_id="w1", placer_address=no_placer(tmp_path), models=models,
        arena_bytes=arena_bytes, kv_cache_bytes=512 << 10, heartbeat_interval_s=60.0, drain_timeout_s=0.5,
        dtype="float32",  # as LLM() below: the worker's "auto" is bfloat16 wherever that measures faster
    )  # fmt: skip
    async with serving(settings) as running:
        yield running


def generate_request(model: str, prompt: list[int]) -> inference_pb2.GenerateRequest:
    sampling = inference_pb2.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return inference_pb2.GenerateRequest(
        model=model, prompt_token_ids=inference_pb2.TokenIds(ids=prompt), sampling=sampling,
        workload_class=common_pb2.WORKLOAD_CLASS_REALTIME_CHAT,
    )  # fmt: skip


async def streamed(stub: worker_pb2_grpc.WorkerStub, model: str, prompt: list[int]) -> list[int]:
    return [t async for r in stub.Generate(generate_request(model, prompt)) for t in r.token_ids]


async def test_three_models_served_at_once_each_as_if_alone(
    tmp_path: Path, decoders: dict[str, Path], minilm_dir: Path
) -> None:
    models = {**decoders, "minilm": minilm_dir}
    async with running_worker(tmp_path, models, 256 << 20) as (app, stub):
        assert app.host.memory is not None and set(app.host.memory.usage()) == set(models)
        calls = [streamed(stub, name, p) for name in decoders for p in PROMPTS]
        calls += [stub.Embed(inference_pb2.EmbedRequest(model="minilm", inputs=TEXTS[i:])) for i in range(3)]
        results = await asyncio.gather(*calls)
        app.host.memory.check()
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    got = iter(results)
    for path in decoders.values():
        alone = LLM(path).generate(PROMPTS, greedy)
        assert [next(got) for _ in PROMPTS] == [c.token_ids for c in alone]
    encoder = EmbeddingEngine(minilm_dir)
    try:
        for i in range(3):
            reply = next(got)
            vectors = np.array([e.values for e in reply.data], dtype=np.float32)
            np.testing.assert_allclose(vectors, encoder.encode(TEXTS[i:]), atol=1e-5)
    finally:
        encoder.close()


async def test_lifecycle_errors_leave_the_resident_models_serving(
    tmp_path: Path, decoders: dict[str, Path]
) -> None:
    corrupt = shutil.copytree(decoders["llama-b"], tmp_path / "corrupt")
    for weights in corrupt.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    big = make_decoder_checkpoint(tmp_path / "big", **{**SPEC, "hidden_size": 512, "intermediate_size": 2048})
    models = {"llama-a": decoders["llama-a"], "corrupt": corrupt, "big": big}
    async with running_worker(tmp_path, models, 8 << 20) as (app, stub):
        assert set(app.host.models) == {"llama-a"}, "the start skipped what it could not load"
        expected = await streamed(stub, "llama-a", PROMPTS[0])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.LoadModel(worker_pb2.LoadModelRequest(model="corrupt"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "safetensors" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.LoadModel(worker_pb2.LoadModelRequest(model="big"))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "does not fit even after evicting" in (err.value.details() or "")
        assert await streamed(stub, "llama-a", PROMPTS[0]) == expected

        await stub.EvictModel(worker_pb2.EvictModelRequest(model="llama-a"))
        report = node_report("w1", app.address, app.settings, app.host, draining=False)
        assert [(m.name, m.resident, m.host_copy) for m in report.models] == [("llama-a", False, True)]
        # The placer counts a host copy as loadable, so a request for the evicted model reloads it.
        assert await streamed(stub, "llama-a", PROMPTS[0]) == expected
        assert "llama-a" in app.host.models and "llama-a" not in app.host.host_copies
        await stub.EvictModel(worker_pb2.EvictModelRequest(model="llama-a"))
        reloaded = await stub.LoadModel(worker_pb2.LoadModelRequest(model="llama-a"))
        assert reloaded.model.resident
        assert await streamed(stub, "llama-a", PROMPTS[0]) == expected
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await streamed(stub, "not-in-the-catalog", PROMPTS[0])
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
