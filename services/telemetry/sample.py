"""One GPU reading in plain Python, and its conversion to the GpuSample proto at the edge."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hanzo.inference.v1 import telemetry_pb2


class SampleSource(enum.StrEnum):
    """Where a reading came from; simulated readings must never pass for real ones."""

    NVML = "nvml"
    SIMULATED = "simulated"


class ClockEventReason(enum.IntFlag):
    """The NVML clock-event (throttle) reason bits the simulated source sets; values as in nvml.h."""

    SW_THERMAL_SLOWDOWN = 0x20  # nvmlClocksEventReasonSwThermalSlowdown
    HW_THERMAL_SLOWDOWN = 0x40  # nvmlClocksEventReasonHwThermalSlowdown


_PROTO_SOURCE = {
    SampleSource.NVML: telemetry_pb2.TELEMETRY_SOURCE_NVML,
    SampleSource.SIMULATED: telemetry_pb2.TELEMETRY_SOURCE_SIMULATED,
}


@dataclass(frozen=True, kw_only=True)
class GpuReading:
    """One reading of one GPU. Degrees C, watts, MHz, bytes; 0 for a value the GPU does not report."""

    gpu_index: int
    timestamp_s: float  # Unix time of the reading
    source: SampleSource
    temperature_c: float
    slowdown_temperature_c: float
    shutdown_temperature_c: float
    clock_event_reasons: int  # raw NVML bit mask (see ClockEventReason for the thermal bits)
    power_w: float
    power_limit_w: float  # enforced limit
    sm_clock_mhz: float
    sm_clock_max_mhz: float
    memory_used_bytes: int
    memory_total_bytes: int
    utilization: float  # busy fraction in [0, 1]
    uuid: str = ""  # NVML's "GPU-..." id; "" when the source has none (simulated)
    name: str = ""  # the product name, e.g. "NVIDIA H200"

    def to_proto(self) -> telemetry_pb2.GpuSample:
        """The wire form; power stays in watts, as the field names say."""
        return telemetry_pb2.GpuSample(
            gpu_index=self.gpu_index,
            timestamp_s=self.timestamp_s,
            source=_PROTO_SOURCE[self.source],
            temperature_c=self.temperature_c,
            slowdown_temperature_c=self.slowdown_temperature_c,
            shutdown_temperature_c=self.shutdown_temperature_c,
            clock_event_reasons=self.clock_event_reasons,
            power_w=self.power_w,
            power_limit_w=self.power_limit_w,
            sm_clock_mhz=self.sm_clock_mhz,
            sm_clock_max_mhz=self.sm_clock_max_mhz,
            memory_used_bytes=self.memory_used_bytes,
            memory_total_bytes=self.memory_total_bytes,
            utilization=self.utilization,
        )
