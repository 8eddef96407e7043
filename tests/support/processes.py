"""Start a service as a real process (`python -m services.X`) and wait for its READY line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class ServiceProcess:
    """A running service; `ready` holds the key=value pairs of its READY line."""

    def __init__(self, module: str, env: dict[str, str], ready_prefix: str, timeout_s: float = 60.0) -> None:
        self.module = module
        self.output: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.ready: dict[str, str] = {}
        found = threading.Event()

        def pump() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line)
                if line.startswith(ready_prefix) and not found.is_set():
                    self.ready = dict(part.split("=", 1) for part in line.split()[1:])
                    found.set()

        self._reader = threading.Thread(target=pump, daemon=True)
        self._reader.start()
        if not found.wait(timeout_s):
            self.stop()
            raise RuntimeError(f"{module} did not become ready:\n{''.join(self.output[-40:])}")

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM (graceful), then SIGKILL if it hangs; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
