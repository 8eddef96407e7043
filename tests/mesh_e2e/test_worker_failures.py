"""Worker processes killed under the gateway: before the first token the request moves to another
worker; mid-stream the caller gets UNAVAILABLE saying how many tokens it got, none repeated."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc
from services.common.redis_server import RedisServer
from services.mesh.process import ChildProcess, start_service
from services.mesh.service_env import service_env
from tests.placer.cluster_helpers import eventually, placer_stub

LONG = inference_pb2.SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True)
SHORT = inference_pb2.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@dataclass
class ProcessMesh:
    placer: ChildProcess
    workers: dict[str, ChildProcess]
    gateway: ChildProcess


@pytest.fixture
def process_mesh(redis_server: RedisServer, llama_gqa_dir: Path, tmp_path: Path) -> Iterator[ProcessMesh]:
    """Placer, workers w-near (same zone and rack as the gateway, so preferred) and w-far, gateway."""
    placer_env = service_env("placer", redis_url=redis_server.url, port=0, heartbeat_interval_s=0.5)
    placer = start_service("placer", "services.placer", placer_env, "PLACER_READY", tmp_path / "placer.log")
    workers = {}
    for node_id, zone in (("w-near", "z1"), ("w-far", "z2")):
        env = service_env(
            "worker", port=0, node_id=node_id, zone=zone, rack="r1", hostname=f"{node_id}-host",
            placer_address=placer.ready["address"], models={"llama": llama_gqa_dir}, heartbeat_interval_s=0.5,
        )  # fmt: skip
        workers[node_id] = start_service(
            node_id, "services.worker", env, "WORKER_READY", tmp_path / f"{node_id}.log"
        )
    gateway_env = service_env(
        "gateway", port=0, http_port=0, placer_address=placer.ready["address"], redis_url=redis_server.url,
        zone="z1", rack="r1", hostname="gateway-host",
    )  # fmt: skip
    gateway = start_service(
        "gateway", "services.gateway", gateway_env, "GATEWAY_READY", tmp_path / "gateway.log"
    )
    mesh = ProcessMesh(placer, workers, gateway)
    yield mesh
    for process in (gateway, *workers.values(), placer):
        process.stop()


async def _registered(mesh: ProcessMesh) -> None:
    channel, stub = placer_stub(mesh.placer.ready["address"])
    async with channel:

        async def both() -> bool:
            from hanzo.inference.v1 import placer_pb2

            return len((await stub.ListNodes(placer_pb2.ListNodesRequest())).nodes) == 2

        await eventually(both, 30, "both workers registered")


async def test_worker_killed_before_first_token_request_moves(process_mesh: ProcessMesh) -> None:
    await _registered(process_mesh)
    async with grpc.aio.insecure_channel(process_mesh.gateway.ready["address"]) as channel:
        inference = inference_pb2_grpc.InferenceStub(channel)
        request = inference_pb2.GenerateRequest(model="llama", prompt="hello", sampling=SHORT)
        first = [r async for r in inference.Generate(request)]
        assert first[0].node_id == "w-near"  # topology: same zone and rack as the gateway
        # Dies without a goodbye; the placer still lists it until its heartbeat TTL runs out.
        process_mesh.workers["w-near"].kill()
        for _ in range(3):
            responses = [r async for r in inference.Generate(request)]
            assert responses[0].node_id == "w-far"
            assert [t for r in responses for t in r.token_ids] == [t for r in first for t in r.token_ids]
            assert responses[-1].finish_reason == inference_pb2.FINISH_REASON_LENGTH


async def test_worker_killed_mid_stream_ends_with_unavailable_and_no_repeats(
    process_mesh: ProcessMesh,
) -> None:
    await _registered(process_mesh)
    async with grpc.aio.insecure_channel(process_mesh.gateway.ready["address"]) as channel:
        inference = inference_pb2_grpc.InferenceStub(channel)
        call = inference.Generate(inference_pb2.GenerateRequest(model="llama", prompt="go on", sampling=LONG))
        received: list[int] = []
        serving = killed = None
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for response in call:
                serving = serving or response.node_id  # the first message names the node
                received += response.token_ids
                # >= rather than ==: a message may carry several tokens when the reader fell behind.
                if len(received) >= 5 and killed is None:
                    killed = process_mesh.workers[serving].kill()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        details = err.value.details()
        assert f"after {len(received)} tokens were sent" in details and "nothing is repeated" in details
        assert 5 <= len(received) < LONG.max_tokens


async def test_sigterm_drains_in_flight_streams(process_mesh: ProcessMesh) -> None:
    await _registered(process_mesh)
    medium = inference_pb2.SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True)
    async with grpc.aio.insecure_channel(process_mesh.gateway.ready["address"]) as channel:
        inference = inference_pb2_grpc.InferenceStub(channel)
        call = inference.Generate(
            inference_pb2.GenerateRequest(model="llama", prompt="drain me", sampling=medium)
        )
        received: list[int] = []
        stopping = None
        async for response in call:
            received += response.token_ids
            if stopping is None:
                worker = process_mesh.workers[response.node_id]
                # Graceful stop while the stream runs: the stream still completes.
                stopping = asyncio.create_task(asyncio.to_thread(worker.stop))
        assert len(received) == medium.max_tokens
        assert stopping is not None and await stopping == 0
