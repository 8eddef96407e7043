"""The local mesh's process lifecycle: Redis, placer, workers with telemetry, gateway; stopped in reverse."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from services.common.internal_auth import ENV as INTERNAL_TOKEN_ENV
from services.common.internal_auth import token_from_env
from services.common.redact import redact_url
from services.common.redis_server import RedisServer, password_from_env
from services.mesh.models import ModelSet
from services.mesh.process import ChildProcess, ServiceStartError
from services.mesh.prometheus import LocalPrometheus
from services.mesh.redis_service import SupervisedRedis
from services.mesh.service_env import service_env
from services.mesh.supervise import RestartPolicy, Supervised, Supervisor

ZONE = "z1"
# The ports a restarted service binds again (env var -> its READY key): the placer's and the gateway's
# addresses are in the others' settings and the clients', a worker's in the placer's view.
KEEP_PORTS = {
    "services.placer": {"HANZO_PLACER_PORT": "address"},
    "services.worker": {"HANZO_WORKER_PORT": "address"},
    "services.gateway": {"HANZO_GATEWAY_PORT": "address", "HANZO_GATEWAY_HTTP_PORT": "http_address"},
}


@dataclass(frozen=True)
class StackConfig:
    """run_dir: logs and Redis files go here. redis_url: None starts a private Redis. base_port: None
    lets every service bind port 0 (a free one); else ports are handed out upwards from it.
    gateway_port / http_port: the gateway's gRPC and OpenAI HTTP ports (None: as the other ports; 0: a
    free one). worker_env: HANZO_WORKER_* settings every worker gets (dtype, context, KV budget).
    prometheus_port: None runs no Prometheus; else a local one scraping every service on it (0: free)."""

    run_dir: Path
    models: ModelSet
    api_key: str
    workers: int = 2
    redis_url: str | None = None
    base_port: int | None = None
    gateway_port: int | None = None
    http_port: int | None = None
    worker_env: Mapping[str, str] = field(default_factory=dict)
    prometheus_port: int | None = None
    ready_timeout_s: float = 180.0
    stop_timeout_s: float = 20.0


@dataclass(frozen=True)
class ServiceInfo:
    """One row of the process table; address/metrics_port are None where the service has none."""

    name: str
    pid: int
    address: str | None
    metrics_port: str | None
    log_path: Path | None
    detail: str = ""


@dataclass
class _Ports:
    base: int | None
    taken: int = 0

    def take(self) -> int:
        """Next port from base, or 0 (bind any free port) when no base was given."""
        if self.base is None:
            return 0
        self.taken += 1
        return self.base + self.taken - 1


@dataclass
class Stack:
    """Start with start() (or `with`), stop with stop(); a half-started stack stops what it started."""

    config: StackConfig
    services: list[ServiceInfo] = field(default_factory=list)
    gateway_address: str = ""
    http_address: str = ""  # host:port of the gateway's OpenAI-compatible front
    _tiers: list[list[ChildProcess]] = field(default_factory=list)  # start order; stopped reversed
    _redis: RedisServer | None = None
    prometheus: LocalPrometheus | None = None
    _details: dict[str, str] = field(default_factory=dict)  # worker name -> topology and models
    # This run's internal credential (services/common/internal_auth.py): HANZO_INTERNAL_TOKEN where the
    # caller set one (to reach the services themselves), else made fresh for each stack.
    _internal_token: str = field(default_factory=lambda: token_from_env() or secrets.token_urlsafe(24))

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None):
        self.stop()

    def start(self) -> None:
        """Start every service and wait for its READY line; ServiceStartError names the one that failed."""
        cfg = self.config
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        ports = _Ports(cfg.base_port)
        redis_url = cfg.redis_url
        if redis_url is None:
            # Its password: HANZO_REDIS_PASSWORD where the caller set one (to read the cluster state
            # itself), else a fresh one; the services get it inside the url.
            self._redis = RedisServer(cfg.run_dir, port=ports.take() or None, password=password_from_env())
            self._redis.start()
            redis_url = self._redis.url
            pid = self._redis.process.pid if self._redis.process else 0
            self.services.append(ServiceInfo("redis", pid, f"127.0.0.1:{self._redis.port}", None, None))
        # A per-run key prefix keeps a shared --redis-url free of nodes left over from earlier runs.
        prefix = f"hanzo-mesh-{cfg.run_dir.name}"
        placer_env = service_env(
            "placer", port=ports.take(), metrics_port=ports.take(), redis_url=redis_url, key_prefix=prefix
        )
        placer = self._start_tier([self._child("placer", "services.placer", "PLACER_READY", placer_env)])[0]
        placer_address = placer.ready["address"]
        self._add_row(placer, f"redis {redact_url(redis_url)} prefix {prefix}")  # the table is printed
        workers = self._start_tier([self._worker(i, ports, placer_address) for i in range(cfg.workers)])
        for w in workers:
            if w.ready.get("serving") == "False":
                raise ServiceStartError(
                    f"{w.name} could not load any of its models ({self._details[w.name]}); see {w.log_path}"
                )
            self._add_row(w, self._details[w.name] + f", serving {w.ready.get('models', '?')}")
        agents = [
            self._child(
                f"telemetry-{i + 1}",
                "services.telemetry",
                "TELEMETRY_READY",
                service_env(
                    "telemetry",
                    node_id=w.ready.get("node_id", f"mesh-w{i + 1}"),
                    placer_address=placer_address,
                    metrics_port=ports.take(),  # DCGM-named GPU series, as dcgm-exporter serves them
                ),
            )
            for i, w in enumerate(workers)
        ]
        gateway_env = service_env(
            "gateway",
            port=_chosen(cfg.gateway_port, ports),
            http_port=_chosen(cfg.http_port, ports),
            metrics_port=ports.take(),
            placer_address=placer_address,
            redis_url=redis_url,
            key_prefix=prefix,
            api_keys=cfg.api_key,
            zone=ZONE,
            rack="r1",
            hostname="mesh-gateway",
        )
        gateway = self._child("gateway", "services.gateway", "GATEWAY_READY", gateway_env)
        # Telemetry agents and the gateway start together: neither waits on the other.
        self._tiers.append(agents)
        self._tiers.append([gateway])
        for agent in agents:
            agent.wait_ready(cfg.ready_timeout_s)
            self._add_row(agent, f"node {agent.ready.get('node_id')}, source {agent.ready.get('source')}")
        gateway.wait_ready(cfg.ready_timeout_s)
        self.gateway_address = gateway.ready["address"]
        http = gateway.ready.get("http_address", "None")
        self.http_address = "" if http == "None" else http  # None: the gateway runs no HTTP front
        self._add_row(gateway, f"zone {ZONE} rack r1, API key required, OpenAI HTTP on {self.http_address}")
        if cfg.prometheus_port is not None:
            self._start_prometheus(cfg.prometheus_port)

    def supervisor(
        self, policy: RestartPolicy | None = None, say: Callable[[str], None] = print
    ) -> Supervisor:
        """A Supervisor restarting this stack's services, its private Redis among them (call after
        start(); see supervise.py)."""
        redis = [[SupervisedRedis(self._redis, self.config.run_dir)]] if self._redis is not None else []
        tiers: list[list[Supervised]] = [*redis, *self._tiers]  # the stack's own lists: restarts land in them
        return Supervisor(tiers, KEEP_PORTS, policy, say, self.config.ready_timeout_s)

    def exited(self) -> list[tuple[str, int]]:
        """(name, exit code) of every child that has exited; empty while all run."""
        return [(c.name, code) for tier in self._tiers for c in tier if (code := c.poll()) is not None]

    def stop(self) -> dict[str, int]:
        """SIGTERM each tier in reverse start order, wait, SIGKILL stragglers; returns exit codes by name."""
        codes: dict[str, int] = {}
        if self.prometheus is not None:  # first: it would only log the others' scrapes failing
            self.prometheus.stop()
            self.prometheus = None
        while self._tiers:
            tier = self._tiers.pop()
            for child in tier:  # the whole tier drains at once: gateway, then agents, workers, placer
                child.terminate()
            for child in tier:
                codes[child.name] = child.wait_or_kill(self.config.stop_timeout_s)
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        return codes

    def _start_prometheus(self, port: int) -> None:
        targets = [(s.name, f"127.0.0.1:{s.metrics_port}") for s in self.services if s.metrics_port]
        self.prometheus = LocalPrometheus(self.config.run_dir, targets, port)
        self.prometheus.start(self.config.ready_timeout_s)
        pid = self.prometheus.process.pid if self.prometheus.process else 0
        detail = f"scraping {len(targets)} services every second, rules from deploy/prometheus/rules"
        address = f"127.0.0.1:{self.prometheus.port}"
        self.services.append(ServiceInfo("prometheus", pid, address, None, self.prometheus.log_path, detail))

    def _worker(self, index: int, ports: _Ports, placer_address: str) -> ChildProcess:
        models = self.config.models.for_worker(index)
        node_id, rack, host = f"mesh-w{index + 1}", f"r{index % 2 + 1}", f"mesh-host-{index + 1}"
        env = service_env(
            "worker", port=ports.take(), metrics_port=ports.take(), node_id=node_id,
            placer_address=placer_address, models=models, zone=ZONE, rack=rack, hostname=host,
        )  # fmt: skip
        env.update(self.config.worker_env)
        if "OMP_NUM_THREADS" not in os.environ:
            # Each worker's torch would otherwise start one thread per core and the workers would fight
            # over the same cores; split them instead.
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.config.workers))
        child = self._child(f"worker-{index + 1}", "services.worker", "WORKER_READY", env)
        self._details[child.name] = f"{ZONE}/{rack}/{host}, models {', '.join(models)}"
        return child

    def _child(self, name: str, module: str, ready_prefix: str, env: dict[str, str]) -> ChildProcess:
        log_path = self.config.run_dir / f"{name}.log"
        env = {**env, INTERNAL_TOKEN_ENV: self._internal_token}  # every service: internal RPCs need it
        return ChildProcess(name, module, env, ready_prefix, log_path)

    def _start_tier(self, children: list[ChildProcess]) -> list[ChildProcess]:
        # Registered before waiting, so a failure while waiting still stops the whole tier.
        self._tiers.append(children)
        for child in children:
            child.wait_ready(self.config.ready_timeout_s)
        return children

    def _add_row(self, child: ChildProcess, detail: str) -> None:
        metrics = child.ready.get("metrics_port")
        self.services.append(
            ServiceInfo(
                child.name,
                child.pid,
                child.ready.get("address"),
                None if metrics in (None, "None") else metrics,
                child.log_path,
                detail,
            )
        )


def _chosen(port: int | None, ports: _Ports) -> int:
    """A port given explicitly, else the next one handed out."""
    return ports.take() if port is None else port


def new_run_dir(root: Path) -> Path:
    """A fresh root/run-<timestamp>-<pid> directory (the pid keeps two runs in one second apart)."""
    path = Path(root).resolve() / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def format_process_table(services: list[ServiceInfo]) -> str:
    """Fixed-width text table: name, pid, address, metrics port, detail."""
    rows = [("service", "pid", "address", "metrics", "detail")]
    rows += [(s.name, str(s.pid), s.address or "-", s.metrics_port or "-", s.detail) for s in services]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows
    )
