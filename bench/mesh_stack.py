"""The processes of bench/mesh.py: a private Redis, a placer, ONE worker and the gateway, each a real
`python -m services.X` child on a free port, stopped in reverse order (gateway first) on every exit path."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc
from services.common.redis_server import RedisServer
from services.mesh.process import ChildProcess, stop_newest_first
from services.mesh.service_env import service_env

MODEL_NAME = "bench-llama"
# hidden 256, 4 layers, vocab 512 (the synthetic tokenizer's size): a few ms per decode step on CPU, so the
# mesh's per-request overhead is a visible fraction of the request, as it would be on a GPU.
MODEL_SPEC = {
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 2,
    "seed": 7,
}
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0


def ensure_model(model_dir: Path) -> Path:
    """The benchmark checkpoint in model_dir (built once; make_decoder_checkpoint is idempotent)."""
    from services.worker.models.synthetic import make_decoder_checkpoint

    return make_decoder_checkpoint(model_dir.resolve(), **MODEL_SPEC)


@dataclass
class MeshStack:
    """Use as a context manager; worker_address/gateway_address are set once __enter__ returned.
    worker_threads: OMP/torch threads of the worker, None for torch's default (one per core)."""

    run_dir: Path
    model_dir: Path
    api_key: str
    worker_threads: int | None = 1
    placement: str = "embedded"  # the gateway's HANZO_GATEWAY_PLACEMENT
    worker_address: str = ""
    gateway_address: str = ""
    gateway_pid: int = 0
    worker_pid: int = 0
    proxy_address: str = ""  # bench/mesh_proxy.py in front of the worker: the floor of one Python hop
    proxy_pid: int = 0
    placer_pid: int = 0
    _children: list[ChildProcess] = field(default_factory=list)  # start order; stopped reversed
    _redis: RedisServer | None = None

    def __enter__(self) -> MeshStack:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None):
        self.stop()

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._redis = RedisServer(self.run_dir)
        self._redis.start()
        key_prefix = f"bench-mesh-{self.run_dir.name}"
        placer_env = service_env("placer", port=0, redis_url=self._redis.url, key_prefix=key_prefix)
        placer = self._child("placer", "services.placer", "PLACER_READY", placer_env)
        placer_address, self.placer_pid = placer.ready["address"], placer.pid
        worker_env = service_env(
            "worker",
            port=0,
            node_id="bench-w1",
            placer_address=placer_address,
            models={MODEL_NAME: self.model_dir},
        )
        if self.worker_threads is not None:
            worker_env["OMP_NUM_THREADS"] = str(self.worker_threads)
        worker = self._child("worker", "services.worker", "WORKER_READY", worker_env)
        self.worker_address, self.worker_pid = worker.ready["address"], worker.pid
        proxy_env = {"HANZO_BENCH_PROXY_UPSTREAM": self.worker_address}
        proxy = self._child("proxy", "bench.mesh_proxy", "PROXY_READY", proxy_env)
        self.proxy_address, self.proxy_pid = proxy.ready["address"], proxy.pid
        gateway_env = service_env(
            "gateway",
            port=0,
            http_port="off",  # the bench drives gRPC; a fixed HTTP port would collide
            placer_address=placer_address,
            api_keys=self.api_key,
            placement=self.placement,
            redis_url=self._redis.url,
            key_prefix=key_prefix,
        )
        gateway = self._child("gateway", "services.gateway", "GATEWAY_READY", gateway_env)
        self.gateway_address, self.gateway_pid = gateway.ready["address"], gateway.pid
        asyncio.run(self._wait_routable(READY_TIMEOUT_S))

    def stop(self) -> dict[str, int]:
        """SIGTERM each child, newest first, SIGKILL after STOP_TIMEOUT_S; then Redis. Exit codes by name."""
        codes = stop_newest_first(self._children, STOP_TIMEOUT_S)
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        return codes

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) each service process has used so far, from /proc (Linux)."""
        pids = {
            "gateway": self.gateway_pid, "worker": self.worker_pid, "placer": self.placer_pid,
            "proxy": self.proxy_pid,
        }  # fmt: skip
        return {name: _cpu_s(pid) for name, pid in pids.items()}

    def pin(self, worker_cpus: set[int], mesh_cpus: set[int]) -> None:
        """Run the worker on worker_cpus and everything else (gateway, placer, Redis, this client) on
        mesh_cpus, every thread of each process: in production the engine has its own cores and the
        gateway runs elsewhere, so sharing a core with the engine's step loop measures contention, not
        the mesh."""
        _pin_process(self.worker_pid, worker_cpus)
        redis_pid = self._redis.process.pid if self._redis and self._redis.process else None
        for pid in (self.gateway_pid, self.placer_pid, self.proxy_pid, redis_pid, os.getpid()):
            if pid:
                _pin_process(pid, mesh_cpus)

    def log_path(self, name: str) -> Path:
        """Where child `name` (placer, worker, gateway) writes stdout and stderr."""
        return self.run_dir / f"{name}.log"

    def _child(self, name: str, module: str, ready_prefix: str, env: dict[str, str]) -> ChildProcess:
        child = ChildProcess(name, module, env, ready_prefix, self.log_path(name))
        self._children.append(child)  # registered before waiting, so a failed start is still stopped
        child.wait_ready(READY_TIMEOUT_S)
        return child

    async def _wait_routable(self, timeout_s: float) -> None:
        """Until the placer (asked through the gateway) lists the worker's model; the worker's first
        heartbeat can land after its READY line."""
        deadline = time.monotonic() + timeout_s
        metadata = (("authorization", f"Bearer {self.api_key}"),)
        async with grpc.aio.insecure_channel(self.gateway_address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            while time.monotonic() < deadline:
                reply = await stub.ListModels(inference_pb2.ListModelsRequest(), metadata=metadata, timeout=5)
                if any(card.name == MODEL_NAME and card.replicas for card in reply.models):
                    return
                await asyncio.sleep(0.1)  # heartbeats come every second: poll, bounded by the deadline
        raise RuntimeError(f"the placer did not list {MODEL_NAME} within {timeout_s:.0f} s")


def _cpu_s(pid: int) -> float:
    # Fields 14 and 15 of /proc/PID/stat (utime, stime, in clock ticks); the name before ")" may hold spaces.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pin_process(pid: int, cpus: set[int]) -> None:
    # Affinity is per thread and inherited at creation: set it on every thread that exists now.
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a short-lived thread may end meanwhile
            os.sched_setaffinity(int(task.name), cpus)
