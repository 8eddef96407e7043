"""The fleet thermal model: steady state, throttling with the NVML bits, and recovery."""

from __future__ import annotations

import numpy as np
import pytest

from services.placer.pick import nvml_bits
from sim.profiles import H200
from sim.thermal import FleetThermal

P = H200.thermal
assert P is not None


def run(thermal: FleetThermal, seconds: int, prefill: float, decode: float) -> None:
    n = thermal.inlet_c.size
    for _ in range(seconds):
        thermal.step(1.0, np.full(n, prefill), np.full(n, decode))


def test_a_gpu_settles_at_inlet_plus_power_times_resistance() -> None:
    thermal = FleetThermal(P, np.array([25.0]), np.array([P.thermal_resistance_c_per_w]))
    run(thermal, 20 * int(P.time_constant_s), prefill=0.0, decode=1.0)  # decoding all the time
    power = P.idle_w + (P.tdp_w - P.idle_w) * P.decode_power_fraction
    assert thermal.power_w[0] == pytest.approx(power)
    assert thermal.temperature_c[0] == pytest.approx(25.0 + P.thermal_resistance_c_per_w * power, abs=0.01)
    assert thermal.throttle_events == 0 and thermal.reasons[0] == 0


def test_the_time_constant_is_minutes() -> None:
    thermal = FleetThermal(P, np.array([25.0]), np.array([P.thermal_resistance_c_per_w]))
    start = thermal.temperature_c[0]
    run(thermal, int(P.time_constant_s), prefill=1.0, decode=0.0)
    final = 25.0 + P.thermal_resistance_c_per_w * P.tdp_w
    assert thermal.temperature_c[0] - start == pytest.approx((final - start) * (1 - np.exp(-1)), rel=0.01)


def test_a_badly_cooled_gpu_throttles_sets_the_bits_and_recovers_when_idle() -> None:
    hot = FleetThermal(P, np.array([25.0, 35.0]), np.array([P.thermal_resistance_c_per_w, 0.1]))
    run(hot, 600, prefill=1.0, decode=0.0)
    assert hot.throttled.tolist() == [False, True] and hot.throttle_events == 1
    assert hot.clock[1] < 1.0 and hot.temperature_c[1] < P.slowdown_c + P.hw_slowdown_margin_c + 2
    assert nvml_bits.any_bits(hot.reasons, nvml_bits.THERMAL_SLOWDOWN).tolist() == [False, True]
    run(hot, 900, prefill=0.0, decode=0.0)
    assert hot.clock.tolist() == [1.0, 1.0] and hot.reasons.tolist() == [0, 0]
    assert hot.throttled_gpu_s > 0
