"""One service as a child process: `python -m services.X`, output to a log file, READY line parsed.

The one launcher for services: the `hanzo-mesh up/demo` stack, the benchmarks and the tests that run
services as real processes all start them here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from services.common.parent_death import launcher_env

ROOT = Path(__file__).resolve().parents[2]  # repo root: children run `-m services.X` from here


class ServiceStartError(RuntimeError):
    """A service exited or stayed silent before its READY line; the message carries its log tail."""


class ChildProcess:
    """A started service. `ready` holds the key=value pairs of its READY line once wait_ready returned.
    Starting does not wait, so several children can start together; start_service starts one and waits."""

    def __init__(
        self,
        name: str,
        module: str,
        env: Mapping[str, str],
        ready_prefix: str,
        log_path: Path,
        args: Sequence[str] = (),
    ):
        """Runs `python -m module *args` with env over this process's environment."""
        self.name = name
        self.module = module
        self.args = tuple(args)
        self.env = dict(env)
        self.ready_prefix = ready_prefix
        self.log_path = log_path
        self.ready: dict[str, str] = {}
        self._pending = b""  # a partial last line of the log, kept for the next read
        self.started_at = time.monotonic()
        with open(log_path, "ab") as log:  # the child keeps its own descriptor; ours can close
            # A reused log holds earlier runs' READY lines: only what this child writes counts.
            self._read_offset = log.tell()
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, *self.args],
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1", **launcher_env()},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own session: a terminal Ctrl-C reaches only the CLI, which then stops children in order.
                # They still die with the CLI if it is SIGKILLed (parent_death). Linux ties that to the
                # thread that started them: start children from a thread that outlives them.
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        """Exit code, or None while it runs."""
        return self.process.poll()

    def wait_ready(self, timeout_s: float) -> dict[str, str]:
        """Block until the READY line appears (timeout_s counted from start); ServiceStartError otherwise."""
        deadline = self.started_at + timeout_s
        while not self.check_ready():
            if time.monotonic() > deadline:
                silent = f"{self.name} printed no {self.ready_prefix} line within {timeout_s:.0f} s"
                raise ServiceStartError(f"{silent}\n{self._tail()}")
            time.sleep(0.05)  # the log file is polled, bounded by the deadline
        return self.ready

    def check_ready(self) -> bool:
        """True once the READY line is out (self.ready then holds it); ServiceStartError if the process
        exited first. Never blocks: a supervisor calls it while it watches the other services."""
        if self.ready:
            return True
        self._pending += self._read_new()
        *lines, self._pending = self._pending.split(b"\n")  # a partial line (and UTF-8 char) waits
        for raw in lines:
            line = raw.decode("utf-8", errors="replace")
            if line.startswith(self.ready_prefix):
                self.ready = dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
                return True
        code = self.poll()
        if code is not None:
            raise ServiceStartError(
                f"{self.name} exited with code {code} before it was ready\n{self._tail()}"
            )
        return False

    def respawn(self, keep_ports: Mapping[str, str]) -> ChildProcess:
        """A new process of this service, same settings and log. keep_ports: env var -> READY key
        (`address`, `http_address`) whose port the new process binds again, so that the services that
        were given this one's address (a placer's, a gateway's) find it there."""
        env = dict(self.env)
        for var, key in keep_ports.items():
            bound = self.ready.get(key, "")
            if var in env and ":" in bound:
                env[var] = bound.rsplit(":", 1)[1]
        return ChildProcess(self.name, self.module, env, self.ready_prefix, self.log_path, self.args)

    def terminate(self) -> None:
        """Ask for a graceful stop (SIGTERM: in-flight work drains); no-op if it already exited."""
        if self.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_or_kill(self, timeout_s: float) -> int:
        """Wait up to timeout_s for it to exit, then SIGKILL; returns the exit code (negative: signal)."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def stop(self, timeout_s: float = 15.0) -> int:
        """terminate, then wait_or_kill(timeout_s); returns the exit code (0: a clean graceful stop)."""
        self.terminate()
        return self.wait_or_kill(timeout_s)

    def kill(self) -> int:
        """SIGKILL now (a crash, no goodbye) and reap it; returns the exit code."""
        self.process.kill()
        return self.process.wait()

    def log_text(self) -> str:
        """Everything it has written to stdout and stderr so far; empty before its first write."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def _read_new(self) -> bytes:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._read_offset)
                data = f.read()
        except FileNotFoundError:
            return b""
        self._read_offset += len(data)
        return data

    def _tail(self, lines: int = 40) -> str:
        body = "\n".join(f"  | {line}" for line in self.log_text().splitlines()[-lines:]) or "  | (no output)"
        return f"last lines of {self.log_path}:\n{body}"


def start_service(
    name: str,
    module: str,
    env: Mapping[str, str],
    ready_prefix: str,
    log_path: Path,
    ready_timeout_s: float = 60.0,
) -> ChildProcess:
    """Start one service and wait for its READY line. On ServiceStartError (or an interrupt) it is killed
    first, so a failed start leaves no process behind for the caller to stop."""
    child = ChildProcess(name, module, env, ready_prefix, log_path)
    try:
        child.wait_ready(ready_timeout_s)
    except BaseException:
        child.kill()  # not ready means nothing to drain: no graceful stop to wait for
        raise
    return child


def stop_newest_first(children: list[ChildProcess], timeout_s: float) -> dict[str, int]:
    """Stop every child, the last started first (it may depend on the earlier ones), emptying the list:
    SIGTERM, then SIGKILL after timeout_s. Exit codes by child name."""
    codes: dict[str, int] = {}
    while children:
        child = children.pop()
        codes[child.name] = child.stop(timeout_s)
    return codes
