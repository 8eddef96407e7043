"""A worker none of whose models loaded says NOT_SERVING on its health check and tells the placer to
offer it nothing (its heartbeat reports it draining), until a model loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.worker.server.config import WorkerSettings
from tests.worker.server.serving import no_placer, serving


async def test_a_worker_with_no_model_loaded_is_not_serving(tmp_path: Path, llama_gqa_dir: Path) -> None:
    broken = shutil.copytree(llama_gqa_dir, tmp_path / "broken")
    (broken / "config.json").write_text("{not json")
    settings = WorkerSettings(
        port=0, node_id="w1", placer_address=no_placer(tmp_path), heartbeat_interval_s=60.0,
        models={"broken": broken, "good": llama_gqa_dir}, arena_bytes=0, kv_cache_bytes=1 << 22,
    )  # fmt: skip
    # Only the broken model is loaded at start: the good one stays in the catalog, unloaded.
    settings_broken_only = WorkerSettings(**{**settings.__dict__, "models": {"broken": broken}})
    async with serving(settings_broken_only) as (app, _):
        async with grpc.aio.insecure_channel(app.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert not app.serving and app._report().draining
    async with serving(settings) as (app, _):
        assert app.serving and not app._report().draining
        assert list(app.host.models) == ["good"]
