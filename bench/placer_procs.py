"""Subprocesses of bench/placer.py: a placer (`python -m services.placer`), the telemetry load
(`python -m bench.placer_telemetry_load`) and the gRPC floor (`python -m bench.placer_floor`), each
started by the mesh's own launcher (services/mesh/process.py: its READY line in its log, SIGTERM then
SIGKILL to stop) and pinned to CPUs."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from services.mesh.process import ChildProcess
from services.mesh.service_env import service_env

REDIS_URL_ENV = "HANZO_BENCH_REDIS_URL"  # bench/placer_telemetry_load.py's Redis, password included


def cpu_layout() -> tuple[set[int], set[int]]:
    """(CPUs for the measuring process, CPUs for everything else): the first allowed CPU and the rest, or
    all allowed CPUs for both on a one-CPU machine."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return set(allowed), set(allowed)
    return {allowed[0]}, set(allowed[1:])


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of process pid to cpus (a new thread inherits its creator's affinity)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), cpus)


def start_placer(
    redis_url: str, env_overrides: dict[str, str], cpus: set[int], log_path: Path
) -> tuple[ChildProcess, str]:
    """A placer process on a free port, pinned to cpus; returns it and its gRPC address once it printed
    PLACER_READY."""
    env = {**service_env("placer", redis_url=redis_url, port=0), **env_overrides}
    child = ChildProcess("placer", "services.placer", env, "PLACER_READY", log_path)
    pin(child.pid, cpus)
    return child, _ready(child)["address"]


def start_floor(reply: Path, cpus: set[int], log_path: Path) -> tuple[ChildProcess, str]:
    """bench/placer_floor.py answering every Pick with the reply in file `reply`, pinned to cpus; returns
    it and its address once it printed FLOOR_READY."""
    child = ChildProcess(
        "placer-floor", "bench.placer_floor", {}, "FLOOR_READY", log_path, ("--reply", str(reply))
    )
    pin(child.pid, cpus)
    return child, _ready(child)["address"]


def start_telemetry_load(
    redis_url: str, rate: float, nodes: int, gpus: int, ttl_s: float, cpus: set[int], log_path: Path
) -> ChildProcess:
    """bench/placer_telemetry_load.py writing `rate` samples per second, pinned to cpus, once it printed
    TELEMETRY_READY."""
    # The URL carries Redis's password: in the environment, not on a command line `ps` shows.
    env = {REDIS_URL_ENV: redis_url}
    args = ("--rate", str(rate), "--nodes", str(nodes), "--gpus", str(gpus), "--ttl-s", str(ttl_s))
    child = ChildProcess(
        "telemetry-load", "bench.placer_telemetry_load", env, "TELEMETRY_READY", log_path, args
    )
    pin(child.pid, cpus)
    # Lowest priority: on a 2-core machine the load must share a core with a measured process, and a
    # background stream should not delay a latency-sensitive one that wakes up (as on a real node).
    os.setpriority(os.PRIO_PROCESS, child.pid, 19)
    _ready(child)
    return child


def _ready(child: ChildProcess) -> dict[str, str]:
    try:
        return child.wait_ready(60)
    except BaseException:
        child.kill()
        raise


def telemetry_result(log_text: str) -> dict[str, float]:
    """The JSON line the telemetry load printed when stopped (in its log); {} if it printed none."""
    for line in reversed(log_text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}
