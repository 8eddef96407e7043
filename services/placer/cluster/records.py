"""The placer's plain-Python view of one worker node, decoded from its heartbeat and telemetry."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ThermalSample:
    """Latest reading of a node's GPU (see telemetry.proto GpuSample for units)."""

    timestamp_s: float
    simulated: bool
    temperature_c: float
    slowdown_temperature_c: float  # 0 when unknown
    shutdown_temperature_c: float  # 0 when unknown
    clock_event_reasons: int
    power_w: float
    power_limit_w: float
    sm_clock_mhz: float
    sm_clock_max_mhz: float
    utilization: float


@dataclass(frozen=True)
class ModelInfo:
    name: str
    weight_bytes: int
    resident: bool
    host_copy: bool


@dataclass(frozen=True)
class NodeRecord:
    """One worker (one GPU). deadline_s is the Unix time after which, without a heartbeat, it is gone."""

    node_id: str
    address: str
    zone: str
    rack: str
    host: str
    gpu_name: str
    memory_total_bytes: int
    memory_free_bytes: int
    models: tuple[ModelInfo, ...]
    running: int
    waiting: int
    kv_usage: float
    max_running: int
    draining: bool
    deadline_s: float
    batch_running: int = 0  # of running and waiting, the BATCH class's
    batch_waiting: int = 0
    latency_prompt_tokens: int = 0  # prompt tokens of the latency classes not yet computed
    thermal: ThermalSample | None = None
    # Rate of temperature change in degrees C per second, smoothed over recent samples.
    temperature_trend_c_per_s: float = 0.0
    labels: dict[str, str] = field(default_factory=dict, compare=False)
