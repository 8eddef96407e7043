"""The internal credential (services/common/internal_auth.py) on a whole mesh in this process: with a
token set, the gateway, workers and placer talk as usual, while a caller without it gets UNAUTHENTICATED
from every internal service, streamed or unary; health stays open for probes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hanzo.inference.v1 import inference_pb2, placer_pb2, placer_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.common.internal_auth import HEADER
from services.common.redis_server import RedisServer
from tests.mesh_e2e.conftest import AUTH, Mesh, running_mesh

TOKEN = "internal-test-token"


@pytest.fixture
async def guarded(redis_server: RedisServer, llama_gqa_dir: Path) -> AsyncIterator[Mesh]:
    async with running_mesh(
        redis_server.url, {"llama": llama_gqa_dir}, workers=1, internal_token=TOKEN
    ) as mesh:
        yield mesh


async def test_the_mesh_serves_with_its_internal_token_and_refuses_calls_without(guarded: Mesh) -> None:
    sampling = inference_pb2.SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    request = inference_pb2.GenerateRequest(model="llama", prompt="hello there", sampling=sampling)
    replies = [r async for r in guarded.inference.Generate(request, metadata=AUTH)]
    assert sum(len(r.token_ids) for r in replies) == 3  # gateway -> placer -> worker, all with the token

    worker = guarded.workers[0].address
    placer = guarded.placer.address
    for metadata, allowed in (((), False), (((HEADER, "wrong"),), False), (((HEADER, TOKEN),), True)):
        async with grpc.aio.insecure_channel(placer) as channel:
            call = placer_pb2_grpc.PlacerStub(channel).ListNodes(
                placer_pb2.ListNodesRequest(), metadata=metadata
            )
            await _expect(call, allowed)
        async with grpc.aio.insecure_channel(worker) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            await _expect(stub.GetStats(worker_pb2.GetStatsRequest(), metadata=metadata), allowed)
            if not allowed:  # the multiplexed stream checks the token itself
                streams = stub.GenerateStreams(metadata=metadata)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await streams.read()
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest())  # probes need no token
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def _expect(call: object, allowed: bool) -> None:
    if allowed:
        await call  # type: ignore[misc]
        return
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call  # type: ignore[misc]
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert HEADER in (refused.value.details() or "")
