"""Every GPU's temperature, power and clocks, advanced together (numpy over the fleet).

First order: the die approaches inlet + power x thermal resistance with the profile's time constant
(exact exponential step, so the interval does not matter). Power is idle plus the dynamic range times
how busy the GPU was, prompt steps at full weight and decode steps at the profile's decode fraction,
scaled by the clock factor cubed (dynamic power ~ f V^2 with voltage following frequency). The driver's
response is a controller on the clock: past the slowdown threshold it cuts the clock (software thermal
slowdown, and the hardware brake too a few degrees further), and gives it back once the GPU is a degree
under; the NVML clock-event bits say which. A throttle event is an episode of slowdown (entered after at
least EPISODE_GAP_S without one), not each dither in and out of it.
"""

from __future__ import annotations

import numpy as np

from services.placer.pick import nvml_bits
from sim.profiles import ThermalProfile

_CUT_PER_C_PER_S = 0.02  # clock cut per degree over the threshold per second
_RESTORE_PER_S = 0.05  # clock given back per second once cool again
_HYSTERESIS_C = 1.0
# A GPU held at its limit dithers in and out of slowdown; one event is an episode, which ends only after
# this long unthrottled.
EPISODE_GAP_S = 60.0


class FleetThermal:
    def __init__(
        self,
        profile: ThermalProfile,
        inlet_c: np.ndarray,
        resistance_c_per_w: np.ndarray,
        initial_activity: float = 0.0,
    ) -> None:
        """initial_activity: start every GPU at the steady state of this activity (0 idle, 1 all prompt
        work), so a run can begin with a fleet that was already serving instead of a cold one."""
        self.profile = profile
        self.inlet_c = inlet_c
        self.resistance = resistance_c_per_w
        n = inlet_c.size
        self.power_w = np.full(n, profile.idle_w + (profile.tdp_w - profile.idle_w) * initial_activity)
        self.temperature_c = inlet_c + resistance_c_per_w * self.power_w
        self.clock = np.ones(n)
        self.reasons = np.zeros(n, dtype=np.uint64)
        self.utilization = np.zeros(n)
        self.throttled = np.zeros(n, dtype=bool)
        self._unthrottled_s = np.full(n, np.inf)  # since the last throttled second
        self.throttle_events = 0
        self.throttled_gpu_s = 0.0
        self.peak_c = float(self.temperature_c.max())

    def step(self, dt: float, busy_prefill_s: np.ndarray, busy_decode_s: np.ndarray) -> np.ndarray:
        """Advance dt seconds given how long each GPU ran prompt and decode steps in them; the GPUs
        whose clock changed (their engines must be told)."""
        p = self.profile
        prefill = np.clip(busy_prefill_s / dt, 0.0, 1.0)
        decode = np.clip(busy_decode_s / dt, 0.0, 1.0 - prefill)
        self.utilization = prefill + decode
        activity = prefill + p.decode_power_fraction * decode
        self.power_w = p.idle_w + (p.tdp_w - p.idle_w) * activity * self.clock**3
        target = self.inlet_c + self.resistance * self.power_w
        self.temperature_c = target + (self.temperature_c - target) * np.exp(-dt / p.time_constant_s)
        self.peak_c = max(self.peak_c, float(self.temperature_c.max()))

        over = self.temperature_c - p.slowdown_c
        old_clock = self.clock
        cut = np.where(over > 0, old_clock - _CUT_PER_C_PER_S * over * dt, old_clock)
        restored = np.where(over < -_HYSTERESIS_C, cut + _RESTORE_PER_S * dt, cut)
        self.clock = np.clip(restored, p.min_clock_factor, 1.0)
        throttled = self.clock < 1.0
        self.throttle_events += int(np.count_nonzero(throttled & (self._unthrottled_s >= EPISODE_GAP_S)))
        self._unthrottled_s = np.where(throttled, 0.0, self._unthrottled_s + dt)
        self.throttled_gpu_s += float(np.count_nonzero(throttled)) * dt
        self.throttled = throttled
        hw = throttled & (over >= p.hw_slowdown_margin_c)
        self.reasons = np.where(throttled, np.uint64(nvml_bits.SW_THERMAL_SLOWDOWN), np.uint64(0))
        self.reasons = np.where(hw, self.reasons | np.uint64(nvml_bits.HW_THERMAL_SLOWDOWN), self.reasons)
        return np.flatnonzero(self.clock != old_clock)
