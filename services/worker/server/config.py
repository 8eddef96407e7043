"""Worker settings: one typed object from HANZO_WORKER_* environment variables (all optional)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.common.env import env_float, env_int, env_optional_int, env_str


def parse_models(raw: str, variable: str) -> dict[str, Path]:
    """ "name=dir,name=dir" -> {name: Path(dir)}; ValueError naming the variable when malformed."""
    models: dict[str, Path] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"{variable}: {item!r} is not name=checkpoint_dir")
        if name.strip() in models:
            raise ValueError(f"{variable}: model {name.strip()!r} is listed twice")
        models[name.strip()] = Path(path.strip())
    return models


@dataclass(frozen=True)
class WorkerSettings:
    """models: the catalog this worker may serve (name -> checkpoint dir); all are loaded at start.
    node_id None means "<hostname>-<bound port>". advertise_address None means the bound address.
    max_waiting: queued requests per model before new ones get RESOURCE_EXHAUSTED."""

    host: str = "127.0.0.1"
    port: int = 50061
    metrics_port: int | None = None
    node_id: str | None = None
    advertise_address: str | None = None
    placer_address: str = "127.0.0.1:50051"
    models: dict[str, Path] = field(default_factory=dict)
    device: str = "cpu"
    dtype: str = "float32"
    kv_cache_bytes: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_waiting: int = 256
    zone: str = ""
    rack: str = ""
    hostname: str = field(default_factory=socket.gethostname)
    heartbeat_interval_s: float = 1.0
    drain_timeout_s: float = 10.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WorkerSettings:
        """Settings from HANZO_WORKER_* variables; ValueError naming a malformed one."""
        p = "HANZO_WORKER_"
        return cls(
            host=env_str(environ, p + "HOST", cls.host),
            port=env_int(environ, p + "PORT", cls.port, minimum=0),
            metrics_port=env_optional_int(environ, p + "METRICS_PORT"),
            node_id=environ.get(p + "NODE_ID") or None,
            advertise_address=environ.get(p + "ADVERTISE_ADDRESS") or None,
            placer_address=env_str(environ, p + "PLACER_ADDRESS", cls.placer_address),
            models=parse_models(environ.get(p + "MODELS", ""), p + "MODELS"),
            device=env_str(environ, p + "DEVICE", cls.device),
            dtype=env_str(environ, p + "DTYPE", cls.dtype),
            kv_cache_bytes=env_optional_int(environ, p + "KV_CACHE_BYTES"),
            max_num_seqs=env_int(environ, p + "MAX_NUM_SEQS", cls.max_num_seqs, minimum=1),
            max_num_batched_tokens=env_int(
                environ, p + "MAX_NUM_BATCHED_TOKENS", cls.max_num_batched_tokens, 1
            ),
            max_waiting=env_int(environ, p + "MAX_WAITING", cls.max_waiting, minimum=0),
            zone=env_str(environ, p + "ZONE", ""),
            rack=env_str(environ, p + "RACK", ""),
            hostname=env_str(environ, p + "HOSTNAME", socket.gethostname()),
            heartbeat_interval_s=env_float(
                environ, p + "HEARTBEAT_INTERVAL_S", cls.heartbeat_interval_s, 0.01
            ),
            drain_timeout_s=env_float(environ, p + "DRAIN_TIMEOUT_S", cls.drain_timeout_s, 0.0),
        )
