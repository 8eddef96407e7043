"""bench/chaos.py's handle on `hanzo-mesh up` run as a user runs it: a subprocess whose output says where
the gateway is, and whose services (its child processes) are found by what they run, since a restart
gives a service a new pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.mesh.process import ROOT

_NODE_ENV = {"services.worker": "HANZO_WORKER_NODE_ID", "services.telemetry": "HANZO_TELEMETRY_NODE_ID"}


@dataclass
class UpProcess:
    """`hanzo-mesh up`; start() returns once it printed its access lines. lines: every output line with
    the time.monotonic() it was first seen (read_new() collects them)."""

    run_root: Path
    workers: int = 2
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    gateway: str = ""
    openai_url: str = ""
    api_key: str = ""
    lines: list[tuple[float, str]] = field(default_factory=list)
    _offset: int = 0

    @property
    def out_path(self) -> Path:
        return self.run_root / "up.out"

    def start(self, ready_timeout_s: float = 600.0) -> None:
        self.run_root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "services.mesh", "up", "--workers", str(self.workers)]
        cmd += ["--run-root", str(self.run_root / "runs")]
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env={**os.environ, **self.env}, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + ready_timeout_s
        while not self.api_key:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`hanzo-mesh up` did not get ready:\n{self.out_path.read_text()[-4000:]}")
            for _, line in self.read_new():
                label, sep, rest = line.partition(": ")
                if sep and label == "gateway":
                    self.gateway = rest.split()[0]
                elif sep and label == "openai":
                    self.openai_url = rest.split()[0]
                elif sep and label == "api key":
                    self.api_key = rest.strip()
            time.sleep(0.2)  # polling a log file: up gives no other signal of readiness

    def read_new(self) -> list[tuple[float, str]]:
        """Output lines written since the last call, stamped now."""
        with open(self.out_path, "rb") as out:
            out.seek(self._offset)
            chunk = out.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        now = time.monotonic()
        fresh = [(now, line) for line in complete.decode(errors="replace").splitlines()]
        self.lines += fresh
        return fresh

    def services(self) -> dict[str, int]:
        """Each running service's pid by name: redis, placer, gateway, worker:<node>, telemetry:<node>."""
        assert self.proc is not None
        found: dict[str, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid != self.proc.pid:
                    continue
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                environ = (entry / "environ").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue  # it exited while being read
            name = _service_name([a.decode() for a in argv], [e.decode(errors="replace") for e in environ])
            if name is not None:
                found[name] = int(entry.name)
        return found

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM, as Ctrl-C would; its exit code (it stops every service first)."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def _service_name(argv: list[str], environ: list[str]) -> str | None:
    if argv and "redis-server" in argv[0]:  # redis sets its title to "PATH HOST:PORT", one argument
        return "redis"
    if "-m" not in argv:
        return None
    module = argv[argv.index("-m") + 1]
    short = module.removeprefix("services.")
    node_key = _NODE_ENV.get(module)
    if node_key is None:
        return short
    node = next((e.split("=", 1)[1] for e in environ if e.startswith(node_key + "=")), "?")
    return f"{short}:{node}"
