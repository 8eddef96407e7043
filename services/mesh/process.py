"""One service as a child process: `python -m services.X`, output to a log file, READY line parsed."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # repo root: children run `-m services.X` from here
_PR_SET_PDEATHSIG = 1


class ServiceStartError(RuntimeError):
    """A service exited or stayed silent before its READY line; the message carries its log tail."""


# Looked up in the parent: between fork and exec the child should only make the one libc call.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent() -> None:
    # Children run in their own session (so a terminal Ctrl-C reaches only the CLI, which then stops them
    # in order); PDEATHSIG still takes them down if the CLI itself is SIGKILLed, so nothing is orphaned.
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildProcess:
    """A started service. `ready` holds the key=value pairs of its READY line once wait_ready returned."""

    def __init__(self, name: str, module: str, env: Mapping[str, str], ready_prefix: str, log_path: Path):
        self.name = name
        self.module = module
        self.ready_prefix = ready_prefix
        self.log_path = log_path
        self.ready: dict[str, str] = {}
        self.started_at = time.monotonic()
        with open(log_path, "ab") as log:  # the child keeps its own descriptor; ours can close
            self.process = subprocess.Popen(
                [sys.executable, "-m", module],
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._read_offset = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        """Exit code, or None while it runs."""
        return self.process.poll()

    def wait_ready(self, timeout_s: float) -> dict[str, str]:
        """Block until the READY line appears (timeout_s counted from start); ServiceStartError otherwise."""
        deadline = self.started_at + timeout_s
        pending = b""
        while True:
            pending += self._read_new()
            *lines, pending = pending.split(b"\n")  # keep a partial last line (and UTF-8 char) for later
            for raw in lines:
                line = raw.decode("utf-8", errors="replace")
                if line.startswith(self.ready_prefix):
                    self.ready = dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
                    return self.ready
            code = self.poll()
            if code is not None:
                raise ServiceStartError(
                    f"{self.name} exited with code {code} before it was ready\n{self._tail()}"
                )
            if time.monotonic() > deadline:
                silent = f"{self.name} printed no {self.ready_prefix} line within {timeout_s:.0f} s"
                raise ServiceStartError(f"{silent}\n{self._tail()}")
            time.sleep(0.05)  # the log file is polled, bounded by the deadline

    def terminate(self) -> None:
        """Ask for a graceful stop (SIGTERM); no-op if it already exited."""
        if self.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_or_kill(self, timeout_s: float) -> int:
        """Wait up to timeout_s for it to exit, then SIGKILL; returns the exit code (negative: signal)."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

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
        text = self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""
        body = "\n".join(f"  | {line}" for line in text.splitlines()[-lines:]) or "  | (no output)"
        return f"last lines of {self.log_path}:\n{body}"
