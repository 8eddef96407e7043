"""A local Prometheus (Debian's `prometheus` package) scraping every service of a running stack, with
the mesh's rules (deploy/prometheus/rules): `hanzo-mesh up --prometheus`. Its jobs are those of
deploy/prometheus/prometheus.yml, so the dashboard and alert expressions read the same series here as
in compose or Kubernetes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from services.common.parent_death import launcher_env
from services.common.redis_server import free_port
from services.mesh.process import ROOT

RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
JOB_OF = {
    "gateway": "hanzo-gateway", "placer": "hanzo-placer", "worker": "hanzo-worker",
    "telemetry": "hanzo-telemetry",
}  # fmt: skip
SCRAPE_INTERVAL_S = 1  # loopback scrapes are cheap; a second keeps rate() windows short for a developer


class PrometheusNotInstalledError(RuntimeError):
    """No prometheus binary on PATH."""


def job_of(service: str) -> str | None:
    """The scrape job of a stack service by its name (worker-2 -> hanzo-worker); None: not scraped."""
    return JOB_OF.get(service.split("-", 1)[0])


def scrape_config(targets: Iterable[tuple[str, str]], interval_s: float = SCRAPE_INTERVAL_S) -> dict:
    """Prometheus's configuration for (service name, host:port of its /metrics) targets: one job per
    kind of service, each target labelled with its service name."""
    jobs: dict[str, list[dict]] = {}
    for service, address in targets:
        job = job_of(service)
        if job is not None:
            jobs.setdefault(job, []).append({"targets": [address], "labels": {"service": service}})
    return {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "rule_files": [str(RULES_DIR / "*.yml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": static} for job, static in sorted(jobs.items())
        ],
    }


class LocalPrometheus:
    """start() writes the config into run_dir and returns once Prometheus is ready; stop() ends it.
    port 0: a free one."""

    def __init__(self, run_dir: Path, targets: Iterable[tuple[str, str]], port: int = 0) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusNotInstalledError(
                "prometheus is not installed: run `sudo apt-get install -y prometheus` (Debian's package; "
                "`make setup` does it when run as root), or leave out --prometheus"
            )
        self.binary = binary
        self.run_dir = run_dir
        self.targets = list(targets)
        self.port = port or free_port()
        self.log_path = run_dir / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        """RuntimeError with the log's tail if it exits or is not ready within timeout_s."""
        config = self.run_dir / "prometheus.yml"
        config.write_text(json.dumps(scrape_config(self.targets), indent=2))  # JSON is YAML
        argv = [
            self.binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.run_dir / 'prometheus-data'}",
            "--storage.tsdb.retention.time=1d",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.common.parent_death", *argv],
                cwd=ROOT, env={**os.environ, **launcher_env()}, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"prometheus did not become ready on {self.url}; its log ends:\n{tail}")
            time.sleep(0.1)  # polling its readiness endpoint: it signals nothing else

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False
