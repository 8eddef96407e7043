"""Worker settings: one typed object from HANZO_WORKER_* environment variables (all optional)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from services.common.env import (
    env_bool,
    env_enum,
    env_float,
    env_int,
    env_optional_float,
    env_optional_int,
    env_str,
)
from services.common.internal_auth import token_from_env
from services.common.workload import WorkloadClass
from services.worker.engine.policy.classes import (
    DEFAULT_CLASS_POLICIES,
    ClassPolicy,
    PolicyConfig,
    PolicyName,
)

_POLICY_FIELDS = tuple(f.name for f in dataclasses.fields(ClassPolicy))
_DEFAULT_POLICY = PolicyConfig()
# A CPU arena is ordinary virtual memory: pages no model or KV pool touched cost nothing. Sized for a
# real model (weights plus the 2 GiB KV pool a decoder gets by default) but not huge: fork() of a process
# holding several (in-process test workers) is refused under the kernel's heuristic overcommit, hence a
# quarter of the memory available at start, within [1 GiB, 4 GiB]. On CUDA the arena takes this
# fraction of the memory free at start.
MIN_CPU_ARENA_BYTES = 1 << 30
MAX_CPU_ARENA_BYTES = 4 << 30
CPU_ARENA_SHARE = 0.25
DEFAULT_CUDA_ARENA_FRACTION = 0.9
DTYPES = ("auto", "float32", "bfloat16", "float16")


def parse_models(raw: str, variable: str) -> dict[str, Path]:
    """ "name=path,name=path" -> {name: Path(path)}, where a path is a checkpoint directory, a .gguf file or
    a named model (smollm2); ValueError naming the variable when malformed."""
    models: dict[str, Path] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"{variable}: {item!r} is not name=checkpoint_dir")
        if name.strip() in models:
            raise ValueError(f"{variable}: model {name.strip()!r} is listed twice")
        models[name.strip()] = Path(path.strip())
    return models


def parse_class_policies(raw: str, variable: str) -> Mapping[WorkloadClass, ClassPolicy]:
    """A JSON object {"BATCH": {"max_waiting": 2}, ...} merged field by field over DEFAULT_CLASS_POLICIES
    (class names case-insensitive; null clears a limit). ValueError naming the variable and the bad key.
    An empty string means the defaults."""
    if not raw.strip():
        return DEFAULT_CLASS_POLICIES
    try:
        overrides = json.loads(raw, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except ValueError as exc:
        raise ValueError(f"{variable}: not a JSON object of class -> fields ({exc})") from None
    if not isinstance(overrides, dict):
        raise ValueError(f"{variable}: expected a JSON object of class -> fields, got {raw!r}")
    merged = dict(DEFAULT_CLASS_POLICIES)
    seen: set[WorkloadClass] = set()
    for key, fields in overrides.items():
        workload = WorkloadClass.__members__.get(key.upper())
        if workload is None:
            known = ", ".join(WorkloadClass.__members__)
            raise ValueError(f"{variable}: unknown workload class {key!r} (known: {known})")
        if workload in seen:
            raise ValueError(f"{variable}: workload class {key!r} is given twice")
        seen.add(workload)
        if not isinstance(fields, dict):
            raise ValueError(f"{variable}: {key}: expected an object of fields, got {fields!r}")
        for name, value in fields.items():
            _check_field(variable, key, name, value)
        try:
            merged[workload] = dataclasses.replace(merged[workload], **fields)
        except ValueError as exc:
            raise ValueError(f"{variable}: {key}: {exc}") from None
    return MappingProxyType(merged)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object hook: a key given twice is a mistake, not "the last one wins"."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key!r} is given twice")
        result[key] = value
    return result


def _no_constant(name: str) -> float:
    """json constant hook: NaN and Infinity are no limit or SLO (use null for "none")."""
    raise ValueError(f"{name} is not a finite number")


def _check_field(variable: str, workload: str, name: str, value: object) -> None:
    """One override's field exists on ClassPolicy and has its JSON type (bool is not a number here)."""
    if name not in _POLICY_FIELDS:
        known = ", ".join(_POLICY_FIELDS)
        raise ValueError(f"{variable}: {workload}: unknown field {name!r} (known: {known})")
    wants_int = name in ("priority", "max_waiting")
    number = isinstance(value, int) if wants_int else isinstance(value, int | float)
    nullable = name != "priority"
    if isinstance(value, bool) or not (number or (nullable and value is None)):
        kind = "an integer" if wants_int else "a number"
        raise ValueError(
            f"{variable}: {workload}.{name} must be {kind}{' or null' if nullable else ''}, got {value!r}"
        )


@dataclass(frozen=True)
class WorkerSettings:
    """models: the catalog this worker may serve (name -> checkpoint dir); all are loaded at start.
    node_id None means "<hostname>-<bound port>". advertise_address None means the bound address.
    max_waiting: queued requests per model before new ones get RESOURCE_EXHAUSTED (every class together,
    the engine's one queue limit, PolicyConfig.max_waiting;
    class_policies sets each class's own limit, queue timeout and SLOs). scheduling_policy, class_policies,
    latency_reserve and itl_min_efficiency make every engine's PolicyConfig (policy_config()).
    The arena (every model's weights and KV pool, reserved at start): arena_bytes, or on CUDA
    arena_fraction of the device's total memory; both None picks the device's default, arena_bytes=0
    runs without an arena. keep_host_copies: an evicted model's weights stay in host memory (pinned on
    CUDA) for a fast reload, up to host_copy_bytes in all (None: no limit). evict_busy: a load that
    needs room may evict models with requests in flight (aborting them); by default only idle ones. Every
    kv_rebalance_interval_s (0: never) a decoder short of KV blocks takes them from idle ones, each
    donor keeping kv_donor_min_blocks.
    """

    host: str = "127.0.0.1"
    port: int = 50061
    metrics_port: int | None = None
    node_id: str | None = None
    advertise_address: str | None = None
    placer_address: str = "127.0.0.1:50051"
    models: dict[str, Path] = field(default_factory=dict)
    device: str = "cpu"
    dtype: str = "auto"
    kv_cache_bytes: int | None = None
    max_model_len: int | None = None
    # vLLM's CPU server defaults: with 64 seats and 1024 tokens a step, 100 chats at once ran 3-8% slower.
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_waiting: int = 256
    zone: str = ""
    rack: str = ""
    hostname: str = field(default_factory=socket.gethostname)
    heartbeat_interval_s: float = 1.0
    drain_timeout_s: float = 10.0
    scheduling_policy: PolicyName = PolicyName.ADAPTIVE
    class_policies: Mapping[WorkloadClass, ClassPolicy] = field(
        default_factory=lambda: DEFAULT_CLASS_POLICIES
    )
    latency_reserve: float = _DEFAULT_POLICY.latency_reserve
    itl_min_efficiency: float = _DEFAULT_POLICY.itl_min_efficiency
    arena_bytes: int | None = None
    arena_fraction: float | None = None
    keep_host_copies: bool = True
    host_copy_bytes: int | None = None
    evict_busy: bool = False
    kv_rebalance_interval_s: float = 1.0
    kv_donor_min_blocks: int = 16
    # Where each engine appends a JSON line per step it runs (engine/step_log.py: what the fleet
    # simulator's serving calibration fits); None: no log.
    step_log_dir: str | None = None
    internal_token: str | None = field(default=None, repr=False)  # HANZO_INTERNAL_TOKEN (internal_auth.py)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"HANZO_WORKER_DTYPE={self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"HANZO_WORKER_MAX_MODEL_LEN={self.max_model_len} must be >= 2")
        self.policy_config()  # a bad policy fails at start, not at the first model load
        if self.arena_bytes is not None and self.arena_fraction is not None:
            raise ValueError("set HANZO_WORKER_ARENA_BYTES or HANZO_WORKER_ARENA_FRACTION, not both")
        if self.arena_fraction is not None and not 0.0 < self.arena_fraction <= 1.0:
            raise ValueError(f"HANZO_WORKER_ARENA_FRACTION={self.arena_fraction} must be in (0, 1]")

    def arena_size(self) -> tuple[float | None, int | None]:
        """(fraction of the GPU's total memory, byte budget) for Arena.for_device, exactly one of them set;
        (None, None) when the worker runs without an arena."""
        if self.arena_bytes == 0:
            return None, None
        if self.arena_bytes is not None or self.arena_fraction is not None:
            return self.arena_fraction, self.arena_bytes
        if self.device.startswith("cuda"):
            return DEFAULT_CUDA_ARENA_FRACTION, None
        return None, default_cpu_arena_bytes()

    def policy_config(self) -> PolicyConfig:
        """The scheduling policy every engine of this worker runs (ValueError when inconsistent)."""
        return PolicyConfig(
            name=self.scheduling_policy,
            classes=self.class_policies,
            latency_reserve=self.latency_reserve,
            itl_min_efficiency=self.itl_min_efficiency,
            max_waiting=self.max_waiting,
        )

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
            max_model_len=env_optional_int(environ, p + "MAX_MODEL_LEN"),
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
            scheduling_policy=env_enum(environ, p + "SCHEDULING_POLICY", PolicyName.ADAPTIVE),
            class_policies=parse_class_policies(environ.get(p + "CLASS_POLICIES", ""), p + "CLASS_POLICIES"),
            latency_reserve=_fraction(environ, p + "LATENCY_RESERVE", cls.latency_reserve),
            itl_min_efficiency=_share(environ, p + "ITL_MIN_EFFICIENCY", cls.itl_min_efficiency),
            arena_bytes=_optional_size(environ, p + "ARENA_BYTES"),
            arena_fraction=env_optional_float(environ, p + "ARENA_FRACTION"),
            keep_host_copies=env_bool(environ, p + "KEEP_HOST_COPIES", cls.keep_host_copies),
            host_copy_bytes=_optional_size(environ, p + "HOST_COPY_BYTES"),
            evict_busy=env_bool(environ, p + "EVICT_BUSY", cls.evict_busy),
            kv_rebalance_interval_s=env_float(
                environ, p + "KV_REBALANCE_INTERVAL_S", cls.kv_rebalance_interval_s, 0.0
            ),
            kv_donor_min_blocks=env_int(environ, p + "KV_DONOR_MIN_BLOCKS", cls.kv_donor_min_blocks, 1),
            step_log_dir=environ.get(p + "STEP_LOG_DIR") or None,
            internal_token=token_from_env(environ),
        )


def default_cpu_arena_bytes() -> int:
    """The CPU arena's size when none is configured: CPU_ARENA_SHARE of the memory available now (Linux
    MemAvailable; the total where that cannot be read), within [MIN, MAX]_CPU_ARENA_BYTES."""
    available = _mem_available_bytes()
    if available is None:
        return MIN_CPU_ARENA_BYTES
    return int(min(max(available * CPU_ARENA_SHARE, MIN_CPU_ARENA_BYTES), MAX_CPU_ARENA_BYTES))


def _mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def _fraction(environ: Mapping[str, str], name: str, default: float) -> float:
    """A float in [0, 1) from environ[name], or default; ValueError naming the variable otherwise."""
    value = env_float(environ, name, default, minimum=0.0)
    if value >= 1.0:
        raise ValueError(f"{name}={environ[name]!r} must be < 1 (a share of the KV pool and of the seats)")
    return value


def _share(environ: Mapping[str, str], name: str, default: float) -> float:
    """A float in [0, 1] from environ[name], or default; ValueError naming the variable otherwise."""
    value = env_float(environ, name, default, minimum=0.0)
    if value > 1.0:
        raise ValueError(f"{name}={environ[name]!r} must be <= 1 (a share of the best tokens/s)")
    return value


def _optional_size(environ: Mapping[str, str], name: str) -> int | None:
    """A byte count >= 0 from environ[name], or None when unset; ValueError naming the variable."""
    return env_int(environ, name, 0, minimum=0) if environ.get(name) not in (None, "") else None
