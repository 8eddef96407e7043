"""A whole mesh in this process: real Redis, placer, two workers and the gateway over loopback gRPC,
all exporting spans to one in-memory exporter (so one request's trace can be checked whole)."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hanzo.inference.v1 import inference_pb2_grpc
from services.common.redis_server import RedisServer
from services.common.tracing import make_tracer_provider
from services.gateway.app import GatewayApp
from services.gateway.config import GatewaySettings
from services.placer.app import PlacerApp
from services.placer.config import PlacerSettings
from services.worker.server.app import WorkerApp
from services.worker.server.config import WorkerSettings
from tests.placer.cluster_helpers import eventually

API_KEY = "test-key"
AUTH = (("authorization", f"Bearer {API_KEY}"),)


@dataclass
class Mesh:
    placer: PlacerApp
    workers: list[WorkerApp]
    gateway: GatewayApp
    spans: InMemorySpanExporter
    inference: inference_pb2_grpc.InferenceStub
    model_dirs: dict[str, Path]


@contextlib.asynccontextmanager
async def running_mesh(
    redis_url: str,
    model_dirs: dict[str, Path],
    workers: int = 2,
    placement: str = "remote",
    gateway_overrides: dict[str, object] | None = None,
    internal_token: str | None = None,
    **worker_overrides: object,
) -> AsyncIterator[Mesh]:
    """gateway_overrides: GatewaySettings fields over the defaults here (the HTTP front on a free port).
    internal_token: every service's internal credential (None: internal RPCs open)."""
    spans = InMemorySpanExporter()
    worker_overrides.setdefault("internal_token", internal_token)
    gateway_overrides = {"internal_token": internal_token, **(gateway_overrides or {})}
    placer = PlacerApp(
        PlacerSettings(
            redis_url=redis_url,
            port=0,
            heartbeat_interval_s=0.3,
            resync_interval_s=0.5,
            internal_token=internal_token,
        ),
        make_tracer_provider("hanzo-placer", spans),
    )
    await placer.start()
    apps = []
    # float32 unless told: the tests compare with LLM(), whose default it is; "auto" is bfloat16 wherever
    # that measures faster.
    worker_overrides.setdefault("dtype", "float32")
    for i in range(workers):
        settings = WorkerSettings(
            port=0, node_id=f"w{i + 1}", placer_address=placer.address, models=model_dirs, zone="z1",
            rack=f"r{i + 1}", hostname=f"host{i + 1}", heartbeat_interval_s=0.3, drain_timeout_s=1.0,
            **worker_overrides,  # type: ignore[arg-type]
        )  # fmt: skip
        app = WorkerApp(settings, make_tracer_provider("hanzo-worker", spans))
        await app.start()
        apps.append(app)
    gateway = GatewayApp(
        GatewaySettings(
            port=0,
            placer_address=placer.address,
            drain_timeout_s=1.0,
            placement=placement,
            redis_url=redis_url,
            resync_interval_s=0.5,
            **{"http_port": 0, "api_keys": frozenset({API_KEY}), **gateway_overrides},  # type: ignore[arg-type]
        ),
        make_tracer_provider("hanzo-gateway", spans),
    )
    await gateway.start()
    channel = grpc.aio.insecure_channel(gateway.address)

    async def registered() -> bool:
        return len(placer.view.nodes) == workers

    await eventually(registered, 20, "every worker registered with the placer")
    if gateway.replica is not None:

        async def seen_by_gateway() -> bool:
            return len(gateway.replica.view.nodes) == workers

        await eventually(seen_by_gateway, 20, "the gateway's embedded replica sees every worker")
    try:
        yield Mesh(placer, apps, gateway, spans, inference_pb2_grpc.InferenceStub(channel), model_dirs)
    finally:
        await channel.close()
        await gateway.stop()
        for app in apps:
            await app.stop()
        await placer.stop()


@pytest.fixture
def model_dirs(llama_gqa_dir: Path, minilm_dir: Path) -> dict[str, Path]:
    return {"llama": llama_gqa_dir, "minilm": minilm_dir}


@pytest.fixture
async def mesh(redis_server: RedisServer, model_dirs: dict[str, Path]) -> AsyncIterator[Mesh]:
    async with running_mesh(redis_server.url, model_dirs) as running:
        yield running


@pytest.fixture(scope="module")
def module_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server shared by one module's tests (for a mesh built once per module)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def no_template_dir(llama_gqa_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama without a chat template: a model that cannot serve Chat."""
    out = tmp_path_factory.mktemp("no_template") / "model"
    shutil.copytree(llama_gqa_dir, out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    return out
