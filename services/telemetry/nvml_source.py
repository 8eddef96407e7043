"""Real GPU readings through NVML (pynvml). Every call blocks, so callers run read() in a thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pynvml

from services.telemetry.sample import GpuReading, SampleSource

_MW_PER_W = 1000.0


def or_zero(query: Callable[..., Any], *args: Any) -> Any:
    """query(*args), or 0 when this GPU does not support the query (e.g. thresholds on some boards)."""
    try:
        return query(*args)
    except pynvml.NVMLError_NotSupported:
        return 0


class NvmlSource:
    """Readings of the GPUs NVML sees (only gpu_index when given), labelled SampleSource.NVML.

    Raises pynvml.NVMLError from the constructor when there is no usable driver or no such GPU.
    """

    def __init__(self, gpu_index: int | None = None, *, wall_clock: Callable[[], float] = time.time) -> None:
        pynvml.nvmlInit()
        try:
            indices = range(pynvml.nvmlDeviceGetCount()) if gpu_index is None else [gpu_index]
            self._handles = [(index, pynvml.nvmlDeviceGetHandleByIndex(index)) for index in indices]
        except pynvml.NVMLError:
            pynvml.nvmlShutdown()
            raise
        # Fixed for a device's life, so asked once: (uuid, product name) per index.
        self._ids = {
            index: (_text(or_zero(pynvml.nvmlDeviceGetUUID, handle) or ""),
                    _text(or_zero(pynvml.nvmlDeviceGetName, handle) or ""))
            for index, handle in self._handles
        }  # fmt: skip
        self._wall_clock = wall_clock
        self._open = True

    def describe(self) -> dict[str, Any]:
        """Driver version and the name of each GPU read, for logs and the GPU check."""
        return {
            "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
            "devices": {index: _text(pynvml.nvmlDeviceGetName(handle)) for index, handle in self._handles},
        }

    def read(self) -> list[GpuReading]:
        """One reading per GPU; a field the GPU does not support reads 0."""
        return [self._read_one(index, handle) for index, handle in self._handles]

    def close(self) -> None:
        """Release NVML; safe to call twice."""
        if self._open:
            self._open = False
            pynvml.nvmlShutdown()

    def _read_one(self, index: int, handle: Any) -> GpuReading:
        memory = or_zero(pynvml.nvmlDeviceGetMemoryInfo, handle)
        rates = or_zero(pynvml.nvmlDeviceGetUtilizationRates, handle)
        uuid, name = self._ids[index]
        return GpuReading(
            gpu_index=index,
            timestamp_s=self._wall_clock(),
            source=SampleSource.NVML,
            temperature_c=float(
                or_zero(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
            ),
            slowdown_temperature_c=float(_threshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
            shutdown_temperature_c=float(_threshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)),
            clock_event_reasons=int(_clock_event_reasons(handle)),
            power_w=or_zero(pynvml.nvmlDeviceGetPowerUsage, handle) / _MW_PER_W,
            power_limit_w=or_zero(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle) / _MW_PER_W,
            sm_clock_mhz=float(or_zero(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)),
            sm_clock_max_mhz=float(or_zero(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM)),
            memory_used_bytes=int(memory.used) if memory else 0,
            memory_total_bytes=int(memory.total) if memory else 0,
            utilization=rates.gpu / 100.0 if rates else 0.0,  # NVML reports percent
            uuid=uuid,
            name=name,
        )


def _threshold(handle: Any, threshold: int) -> int:
    return or_zero(pynvml.nvmlDeviceGetTemperatureThreshold, handle, threshold)


def _clock_event_reasons(handle: Any) -> int:
    # Drivers before the "clock event" rename only export the older, bit-identical throttle-reasons call.
    try:
        return or_zero(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
    except pynvml.NVMLError_FunctionNotFound:
        return or_zero(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes for strings.
    return value.decode() if isinstance(value, bytes) else value
