"""Subprocesses of bench/placer.py: a placer (`python -m services.placer`) and the telemetry load, each
started with a line-based readiness handshake on stdout and stopped with SIGTERM (then SIGKILL)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL_ENV = "HANZO_BENCH_REDIS_URL"  # bench/placer_telemetry_load.py's Redis, password included


class Child:
    """One subprocess; stdout is a pipe read for the readiness line, stderr goes to log_path."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("wb")
        self.process = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=self._log, text=True
        )

    def wait_line(self, prefix: str, timeout_s: float) -> str:
        """The first stdout line starting with prefix; RuntimeError (with the log tail) if the process
        exits first. The timeout is checked between lines (the ready line is the first one printed)."""
        deadline = time.monotonic() + timeout_s
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.process.args} exited before {prefix!r}: {self.log_tail()}")
            if line.startswith(prefix):
                return line.strip()
        raise RuntimeError(f"no {prefix!r} within {timeout_s} s: {self.log_tail()}")

    def stop(self, timeout_s: float = 10.0) -> str:
        """SIGTERM, wait (SIGKILL after timeout_s); returns what was left on stdout."""
        out = ""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        self._log.close()
        return out or ""

    def log_tail(self, chars: int = 2000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]


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
) -> tuple[Child, str]:
    """A placer process on a free port, pinned to cpus; returns it and its gRPC address once it printed
    PLACER_READY."""
    env = {**os.environ, "HANZO_PLACER_REDIS_URL": redis_url, "HANZO_PLACER_PORT": "0", **env_overrides}
    child = Child([sys.executable, "-m", "services.placer"], env, log_path)
    pin(child.process.pid, cpus)
    try:
        ready = child.wait_line("PLACER_READY", timeout_s=60)
    except BaseException:
        child.stop()
        raise
    fields = dict(part.split("=", 1) for part in ready.split()[1:])
    return child, fields["address"]


def start_telemetry_load(
    redis_url: str, rate: float, nodes: int, gpus: int, ttl_s: float, cpus: set[int], log_path: Path
) -> Child:
    """bench/placer_telemetry_load.py writing `rate` samples per second, pinned to cpus, once it printed
    TELEMETRY_READY."""
    args = [
        sys.executable,
        str(ROOT / "bench" / "placer_telemetry_load.py"),
        *("--rate", str(rate), "--nodes", str(nodes), "--gpus", str(gpus), "--ttl-s", str(ttl_s)),
    ]
    # The URL carries Redis's password: in the environment, not on a command line `ps` shows.
    child = Child(args, {**os.environ, REDIS_URL_ENV: redis_url}, log_path)
    pin(child.process.pid, cpus)
    # Lowest priority: on a 2-core machine the load must share a core with a measured process, and a
    # background stream should not delay a latency-sensitive one that wakes up (as on a real node).
    os.setpriority(os.PRIO_PROCESS, child.process.pid, 19)
    try:
        child.wait_line("TELEMETRY_READY", timeout_s=60)
    except BaseException:
        child.stop()
        raise
    return child


def telemetry_result(output: str) -> dict[str, float]:
    """The JSON line the telemetry load printed when stopped; {} if it printed none."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}
