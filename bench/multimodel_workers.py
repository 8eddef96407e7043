"""The worker processes of bench/multimodel_serving.py: one `python -m services.worker` per group of models,
all started together, stopped newest first on every exit path; their RSS read from /proc."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from bench.progress import log
from services.mesh.process import ChildProcess, stop_newest_first
from services.mesh.service_env import service_env

READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
# No placer runs: the first heartbeat fails at once (connection refused, one warning in the log) and the
# next comes only after this interval, so heartbeats cost neither configuration anything during a pass.
HEARTBEAT_INTERVAL_S = 3600.0


@dataclass(frozen=True)
class WorkerSpec:
    """One worker process: its node id, its catalog (model name -> checkpoint dir) and the byte budget of
    its memory arena (HANZO_WORKER_ARENA_BYTES)."""

    node_id: str
    models: dict[str, Path]
    arena_bytes: int


@dataclass
class WorkerGroup:
    """Use as a context manager; `address` (model name -> host:port of the worker serving it) and `pids`
    are set once __enter__ returned. threads: OMP_NUM_THREADS of every worker. kv_cache_bytes: each
    decoder's KV pool, set explicitly so the pool is the same size in either configuration."""

    specs: list[WorkerSpec]
    run_dir: Path
    threads: int
    kv_cache_bytes: int
    address: dict[str, str] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    _children: list[ChildProcess] = field(default_factory=list)
    _placer: socket.socket | None = None

    def __enter__(self) -> WorkerGroup:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None):
        unclean = {name: code for name, code in self.stop().items() if code != 0}
        if unclean:  # reported, not raised: the pass already finished, its numbers stand
            log(f"workers that did not stop cleanly (exit codes; logs in {self.run_dir}): {unclean}")

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # A port bound but never listened on: heartbeats to it are refused at once, and unlike a port
        # number picked and closed, no other process can take it while the workers run.
        self._placer = socket.socket()
        self._placer.bind(("127.0.0.1", 0))
        placer_address = "{}:{}".format(*self._placer.getsockname())
        for spec in self.specs:  # all start before any is waited for: their imports and loads overlap
            env = service_env(
                "worker",
                port=0,
                node_id=spec.node_id,
                models=spec.models,
                placer_address=placer_address,
                device="cpu",  # RSS is the whole footprint only on CPU
                heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
                kv_cache_bytes=self.kv_cache_bytes,
                arena_bytes=spec.arena_bytes,
            )
            env |= {"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}
            log_path = self.run_dir / f"{spec.node_id}.log"
            log_path.unlink(missing_ok=True)  # one run's log per worker, not every round's appended
            # Registered before waiting, so a start that fails later still stops the ones already running.
            self._children.append(
                ChildProcess(spec.node_id, "services.worker", env, "WORKER_READY", log_path)
            )
        for spec, child in zip(self.specs, self._children, strict=True):
            ready = child.wait_ready(READY_TIMEOUT_S)
            self.pids.append(child.pid)
            for name in spec.models:
                self.address[name] = ready["address"]

    def stop(self) -> dict[str, int]:
        """SIGTERM each worker, newest first, SIGKILL after STOP_TIMEOUT_S; exit codes by node id."""
        codes = stop_newest_first(self._children, STOP_TIMEOUT_S)
        if self._placer is not None:
            self._placer.close()
            self._placer = None
        return codes

    def rss_mib(self) -> float:
        """Resident memory of all the group's workers together, MiB (VmRSS of /proc/<pid>/status)."""
        return sum(_rss_kib(pid) for pid in self.pids) / 1024


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])  # "VmRSS:   123456 kB"
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line (a zombie?)")
