"""Telemetry agent settings: one typed object read from HANZO_TELEMETRY_* env vars, split into slices.

Every field has a default, so `python -m services.telemetry` starts on one machine with no config.
Env names: the top-level fields by name (NODE_ID, PLACER_ADDRESS, SOURCE, GPU_INDEX, METRICS_PORT,
HOSTNAME), StreamSettings
by field name (INTERVAL_S, BACKOFF_BASE_S, ...), ProbeSettings with PROBE_ and SimulatedGpuSettings
with SIM_ in front (PROBE_INTERVAL_S, SIM_AMBIENT_C, ...).
"""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from services.common.internal_auth import token_from_env

ENV_PREFIX = "HANZO_TELEMETRY_"


class SettingsError(ValueError):
    """A setting is malformed or out of range; the message names the env var to fix."""


class InvalidSetting(ValueError):
    """Raised by a settings slice's own checks; from_env turns it into a SettingsError naming the var."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field_name = field_name
        self.message = message


class SourceKind(enum.StrEnum):
    AUTO = "auto"  # NVML when the driver answers, else the simulated source (with one warning)
    NVML = "nvml"  # NVML or fail: for GPU nodes where a simulated sample would be a lie
    SIMULATED = "simulated"  # always the thermal model, even on a GPU machine


def _check(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise InvalidSetting(field_name, message)


@dataclass(frozen=True, kw_only=True)
class StreamSettings:
    """How often samples go to the placer, and how reconnects back off: delay for attempt n is
    min(backoff_max_s, backoff_base_s * 2**n), shortened by up to backoff_jitter of itself at random."""

    interval_s: float = 1.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    backoff_jitter: float = 0.2  # fraction in [0, 1]; spreads a fleet's reconnects after a placer restart

    def __post_init__(self) -> None:
        _check(self.interval_s > 0, "interval_s", f"must be > 0, got {self.interval_s}")
        _check(self.backoff_base_s > 0, "backoff_base_s", f"must be > 0, got {self.backoff_base_s}")
        _check(
            self.backoff_max_s >= self.backoff_base_s,
            "backoff_max_s",
            f"must be >= backoff_base_s ({self.backoff_base_s}), got {self.backoff_max_s}",
        )
        _check(
            0 <= self.backoff_jitter <= 1, "backoff_jitter", f"must be in [0, 1], got {self.backoff_jitter}"
        )


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """The simulated source's load input: how often to ask the placer for this node's load."""

    interval_s: float = 1.0
    timeout_s: float = 1.0  # per ListNodes call; a slow placer must not stall the refresh loop
    idle_utilization: float = 0.1  # a worker holding resident models is never fully idle

    def __post_init__(self) -> None:
        _check(self.interval_s > 0, "interval_s", f"must be > 0, got {self.interval_s}")
        _check(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")
        _check(
            0 <= self.idle_utilization <= 1,
            "idle_utilization",
            f"must be in [0, 1], got {self.idle_utilization}",
        )


@dataclass(frozen=True, kw_only=True)
class SimulatedGpuSettings:
    """Constants of the simulated GPU, shaped like an H200 (H100-class, 141 GB) in a warm rack.

    Under sustained full load the GPU settles at ambient_c + heating_c_at_full_load = 88 C, just past
    the 87 C slowdown, so a laptop stack exercises the placer's thermal path; hardware slowdown
    (slowdown_c + hw_slowdown_margin_c = 90 C) needs a hotter ambient.
    """

    gpu_count: int = 1
    ambient_c: float = 30.0  # temperature an idle GPU settles at
    heating_c_at_full_load: float = 58.0  # steady-state rise above ambient at utilization 1
    time_constant_s: float = 30.0  # first-order thermal lag: ~63% of a step change after this long
    slowdown_c: float = 87.0  # NVML slowdown threshold: software slowdown starts above it
    shutdown_c: float = 92.0  # NVML shutdown threshold: the SM clock reaches sm_clock_min_mhz here
    hw_slowdown_margin_c: float = 3.0  # hardware slowdown at/above slowdown_c + this
    idle_power_w: float = 75.0
    power_limit_w: float = 700.0
    sm_clock_max_mhz: float = 1980.0
    sm_clock_min_mhz: float = 990.0  # SM clock when throttled all the way (at shutdown_c)
    memory_total_bytes: int = 143_771 * 1024**2  # what NVML reports for an H200
    memory_used_fraction: float = 0.9  # a worker reserves its memory arena once, at start

    def __post_init__(self) -> None:
        _check(self.gpu_count >= 1, "gpu_count", f"must be >= 1, got {self.gpu_count}")
        _check(self.heating_c_at_full_load >= 0, "heating_c_at_full_load", "must be >= 0")
        _check(self.time_constant_s > 0, "time_constant_s", f"must be > 0, got {self.time_constant_s}")
        _check(
            self.shutdown_c > self.slowdown_c,
            "shutdown_c",
            f"must be above slowdown_c ({self.slowdown_c}), got {self.shutdown_c}",
        )
        _check(self.hw_slowdown_margin_c >= 0, "hw_slowdown_margin_c", "must be >= 0")
        _check(0 <= self.idle_power_w <= self.power_limit_w, "idle_power_w", "must be in [0, power_limit_w]")
        _check(
            0 < self.sm_clock_min_mhz <= self.sm_clock_max_mhz,
            "sm_clock_min_mhz",
            "must be in (0, sm_clock_max_mhz]",
        )
        _check(self.memory_total_bytes > 0, "memory_total_bytes", "must be > 0")
        _check(0 <= self.memory_used_fraction <= 1, "memory_used_fraction", "must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class TelemetrySettings:
    """The whole agent. gpu_index None means every GPU NVML sees (or sim.gpu_count simulated ones).
    metrics_port: the agent's Prometheus /metrics (dcgm-exporter's names: dcgm_metrics.py), None for
    none, 0 for a free port; hostname: their Hostname label."""

    node_id: str = field(default_factory=socket.gethostname)
    placer_address: str = "127.0.0.1:50051"  # host:port of the placer; the mesh launcher sets it
    source: SourceKind = SourceKind.AUTO
    gpu_index: int | None = None
    metrics_port: int | None = None
    hostname: str = field(default_factory=socket.gethostname)
    stream: StreamSettings = field(default_factory=StreamSettings)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    sim: SimulatedGpuSettings = field(default_factory=SimulatedGpuSettings)
    internal_token: str | None = field(default=None, repr=False)  # HANZO_INTERNAL_TOKEN (internal_auth.py)

    def __post_init__(self) -> None:
        _check(bool(self.node_id), "node_id", "must not be empty")
        _check(bool(self.placer_address), "placer_address", "must not be empty (host:port)")
        _check(self.gpu_index is None or self.gpu_index >= 0, "gpu_index", "must be >= 0")
        _check(
            self.metrics_port is None or 0 <= self.metrics_port < 65536,
            "metrics_port",
            "must be in [0, 65535]",
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> TelemetrySettings:
        """Settings from HANZO_TELEMETRY_* vars; unset or empty vars keep their defaults.

        Raises SettingsError naming the variable when one does not parse or is out of range.
        """
        top: dict[str, Any] = {}
        for name, parse in (
            ("node_id", str),
            ("placer_address", str),
            ("source", _source),
            ("gpu_index", int),
            ("metrics_port", int),
            ("hostname", str),
        ):
            value = _read(environ, ENV_PREFIX + name.upper(), parse)
            if value is not None:
                top[name] = value
        top["stream"] = _slice(StreamSettings, environ, ENV_PREFIX)
        top["probe"] = _slice(ProbeSettings, environ, ENV_PREFIX + "PROBE_")
        top["sim"] = _slice(SimulatedGpuSettings, environ, ENV_PREFIX + "SIM_")
        top["internal_token"] = token_from_env(environ)
        return _build(cls, top, ENV_PREFIX)


def _source(text: str) -> SourceKind:
    try:
        return SourceKind(text.strip().lower())
    except ValueError:
        raise ValueError(f"must be one of {', '.join(kind.value for kind in SourceKind)}") from None


def _read(environ: Mapping[str, str], name: str, parse: Any) -> Any:
    """The parsed value of env var `name`; None when it is unset or blank."""
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        return parse(text)
    except ValueError as err:
        raise SettingsError(f"{name}={text!r}: {err}") from None


_Slice = TypeVar("_Slice")


def _slice(cls: type[_Slice], environ: Mapping[str, str], prefix: str) -> _Slice:
    """A flat settings slice whose fields are all plain numbers: each field's type is its default's."""
    values = {}
    for f in fields(cls):  # type: ignore[arg-type]
        value = _read(environ, prefix + f.name.upper(), type(f.default))
        if value is not None:
            values[f.name] = value
    return _build(cls, values, prefix)


def _build(cls: type[_Slice], values: dict[str, Any], prefix: str) -> _Slice:
    try:
        return cls(**values)
    except InvalidSetting as err:
        raise SettingsError(f"{prefix}{err.field_name.upper()}: {err.message}") from None
