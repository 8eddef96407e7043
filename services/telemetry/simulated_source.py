"""A clearly labelled simulated GPU for machines without NVML: a first-order thermal model driven by load.

Per GPU, temperature T follows dT/dt = (ambient + heating * u - T) / tau for utilization u. Between two
reads u is taken as constant (the value read now), so the exact solution over the elapsed dt is used:
T' = target + (T - target) * exp(-dt / tau). Unlike an Euler step it cannot overshoot for any dt.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from services.telemetry.config import SimulatedGpuSettings
from services.telemetry.sample import ClockEventReason, GpuReading, SampleSource


class SimulatedSource:
    """Readings of simulated GPUs, every one labelled SampleSource.SIMULATED.

    load: returns the busy fraction in [0, 1] (out-of-range and NaN values are clamped); it must not
    block, since read() calls it. clock: monotonic seconds, drives the model; wall_clock: Unix seconds,
    stamps readings. Both are injectable so tests step time deterministically.
    initial_temperature_c: the start temperature; None means ambient (a GPU that has been idle).
    """

    def __init__(
        self,
        settings: SimulatedGpuSettings,
        load: Callable[[], float],
        *,
        gpu_indices: Sequence[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        initial_temperature_c: float | None = None,
    ) -> None:
        self._settings = settings
        self._load = load
        self._clock = clock
        self._wall_clock = wall_clock
        self._indices = tuple(gpu_indices) if gpu_indices is not None else tuple(range(settings.gpu_count))
        start = settings.ambient_c if initial_temperature_c is None else initial_temperature_c
        # All simulated GPUs of a node share its load, so they share one temperature too; kept per GPU
        # anyway so a future per-GPU load only changes the input.
        self._temperatures = dict.fromkeys(self._indices, start)
        self._last_s = clock()

    def read(self) -> list[GpuReading]:
        """Advance the model to now and return one reading per simulated GPU."""
        s = self._settings
        now = self._clock()
        elapsed = max(0.0, now - self._last_s)
        self._last_s = now
        utilization = _clamp01(self._load())
        target = s.ambient_c + s.heating_c_at_full_load * utilization
        decay = math.exp(-elapsed / s.time_constant_s)
        timestamp = self._wall_clock()
        readings = []
        for index in self._indices:
            temperature = target + (self._temperatures[index] - target) * decay
            self._temperatures[index] = temperature
            readings.append(self._reading(index, timestamp, temperature, utilization))
        return readings

    def close(self) -> None:
        """Nothing to release; present so every source closes the same way."""

    def _reading(self, index: int, timestamp: float, temperature: float, utilization: float) -> GpuReading:
        s = self._settings
        reasons = 0
        if temperature > s.slowdown_c:
            reasons |= ClockEventReason.SW_THERMAL_SLOWDOWN
        if temperature >= s.slowdown_c + s.hw_slowdown_margin_c:
            reasons |= ClockEventReason.HW_THERMAL_SLOWDOWN
        # Linear from the full clock at the slowdown threshold to the minimum at shutdown. Below the
        # threshold the clock stays at max even when idle, so clock/max reads as "not throttled".
        throttle = _clamp01((temperature - s.slowdown_c) / (s.shutdown_c - s.slowdown_c))
        return GpuReading(
            gpu_index=index,
            timestamp_s=timestamp,
            source=SampleSource.SIMULATED,
            temperature_c=temperature,
            slowdown_temperature_c=s.slowdown_c,
            shutdown_temperature_c=s.shutdown_c,
            clock_event_reasons=int(reasons),
            power_w=s.idle_power_w + (s.power_limit_w - s.idle_power_w) * utilization,
            power_limit_w=s.power_limit_w,
            sm_clock_mhz=s.sm_clock_max_mhz - (s.sm_clock_max_mhz - s.sm_clock_min_mhz) * throttle,
            sm_clock_max_mhz=s.sm_clock_max_mhz,
            memory_used_bytes=int(s.memory_total_bytes * s.memory_used_fraction),
            memory_total_bytes=s.memory_total_bytes,
            utilization=utilization,
        )


def _clamp01(value: float) -> float:
    """value limited to [0, 1]; NaN (a broken load input) counts as 0."""
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, value))
