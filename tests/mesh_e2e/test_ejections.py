"""The gateway's picks around ejected workers on a real mesh: an ejected worker gets no requests while
another can serve them, and is still used when it is the only one left (a suspect worker beats none)."""

from __future__ import annotations

from pathlib import Path

from hanzo.inference.v1 import inference_pb2
from services.common.redis_server import RedisServer
from tests.mesh_e2e.conftest import AUTH, Mesh, running_mesh


async def _node_of(mesh: Mesh, n: int) -> str:
    request = inference_pb2.GenerateRequest(
        model="llama", prompt=f"request {n}", sampling=inference_pb2.SamplingParams(max_tokens=2)
    )
    replies = [r async for r in mesh.inference.Generate(request, metadata=AUTH)]
    return replies[0].node_id


async def test_an_ejected_worker_is_skipped_while_another_serves(
    redis_server: RedisServer, llama_gqa_dir: Path
) -> None:
    async with running_mesh(redis_server.url, {"llama": llama_gqa_dir}, placement="embedded") as mesh:
        mesh.gateway.upstream.ejections.eject("w1", "the test ejected it")
        assert {await _node_of(mesh, n) for n in range(8)} == {"w2"}
        ejected = mesh.gateway.metrics.registry.get_sample_value("hanzo_gateway_worker_ejections_total")
        assert ejected == 1


async def test_ejection_yields_when_no_other_worker_is_left(
    redis_server: RedisServer, llama_gqa_dir: Path
) -> None:
    async with running_mesh(redis_server.url, {"llama": llama_gqa_dir}, workers=1) as mesh:
        mesh.gateway.upstream.ejections.eject("w1", "the test ejected it")
        assert await _node_of(mesh, 0) == "w1"
