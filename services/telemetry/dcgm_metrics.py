"""The agent's own Prometheus metrics, named and labelled as NVIDIA's dcgm-exporter names them, so the
DCGM dashboards and alerts an SRE already has read this node unchanged.

One series per GPU and field, labels `gpu` (the index), `UUID`, `Hostname` and `modelName`, in
dcgm-exporter's units: degrees C, watts, MHz, percent, MiB of framebuffer, the raw clock-event bit mask.
A GPU that stops reporting (fallen off the bus, or the agent now reads only one) has its series
removed, not left at its last value. Simulated readings carry `source="simulated"` on every series and
a UUID that says so; NVML's carry `source="nvml"`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from services.telemetry.sample import GpuReading, SampleSource
from services.telemetry.sources import GpuSource

LABELS = ("gpu", "UUID", "Hostname", "modelName", "source")
_MIB = 1024 * 1024


@dataclass(frozen=True)
class _Field:
    name: str
    help: str
    value: Callable[[GpuReading], float]


FIELDS = (
    _Field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda r: r.temperature_c),
    _Field("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda r: r.power_w),
    _Field("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda r: r.sm_clock_mhz),
    _Field("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda r: round(r.utilization * 100.0, 3)),
    _Field("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda r: r.memory_used_bytes // _MIB),
    _Field(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Current clock event (throttle) reasons, NVML's bit mask.",
        lambda r: float(r.clock_event_reasons),
    ),
    _Field("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Enforced power limit (in W).", lambda r: r.power_limit_w),
    _Field(
        "DCGM_FI_DEV_SLOWDOWN_TEMP", "Temperature at which the GPU slows down (in C).",
        lambda r: r.slowdown_temperature_c,
    ),
)  # fmt: skip


class DcgmMetrics:
    """The gauges of every field above in a registry of their own (served at the agent's /metrics)."""

    def __init__(self, hostname: str, node_id: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._hostname = hostname
        self._node_id = node_id
        self._gauges = [
            (field, Gauge(field.name, field.help, LABELS, registry=self.registry)) for field in FIELDS
        ]
        self._shown: set[tuple[str, ...]] = set()

    def update(self, readings: list[GpuReading]) -> None:
        """Set every GPU's series from one read; remove those of GPUs this read did not include."""
        shown = set()
        for reading in readings:
            labels = self._labels(reading)
            shown.add(labels)
            for field, gauge in self._gauges:
                gauge.labels(*labels).set(field.value(reading))
        for labels in self._shown - shown:
            for _, gauge in self._gauges:
                gauge.remove(*labels)
        self._shown = shown

    def _labels(self, reading: GpuReading) -> tuple[str, ...]:
        simulated = reading.source is SampleSource.SIMULATED
        uuid = reading.uuid or (f"GPU-SIMULATED-{self._node_id}-{reading.gpu_index}" if simulated else "")
        model = reading.name or ("simulated GPU" if simulated else "")
        return (str(reading.gpu_index), uuid, self._hostname, model, reading.source.value)


class MeteredSource:
    """A GpuSource whose every read also updates the agent's DCGM metrics."""

    def __init__(self, source: GpuSource, metrics: DcgmMetrics) -> None:
        self.source = source
        self._metrics = metrics

    def read(self) -> list[GpuReading]:
        readings = self.source.read()
        self._metrics.update(readings)
        return readings

    def close(self) -> None:
        self.source.close()
