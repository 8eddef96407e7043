"""The simulated GPU's thermal model, stepped with an injected clock (no sleeps), and its env settings."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hanzo.inference.v1 import telemetry_pb2
from services.telemetry.config import SettingsError, SimulatedGpuSettings, TelemetrySettings
from services.telemetry.sample import ClockEventReason, SampleSource
from services.telemetry.simulated_source import SimulatedSource

SW = int(ClockEventReason.SW_THERMAL_SLOWDOWN)
HW = int(ClockEventReason.HW_THERMAL_SLOWDOWN)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Load:
    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self) -> float:
        return self.value


def make(load: Load, clock: FakeClock, **kwargs: object) -> SimulatedSource:
    initial = kwargs.pop("initial_temperature_c", None)
    settings = dataclasses.replace(SimulatedGpuSettings(), **kwargs)
    return SimulatedSource(
        settings, load, clock=clock, wall_clock=lambda: 1.7e9, initial_temperature_c=initial
    )


def test_full_load_heats_toward_ambient_plus_heating() -> None:
    clock, load = FakeClock(), Load(1.0)
    source = make(load, clock, ambient_c=30.0, heating_c_at_full_load=40.0, time_constant_s=10.0)
    temps = []
    for _ in range(6):
        clock.now += 10.0
        temps.append(source.read()[0].temperature_c)
    assert temps == sorted(temps)  # monotone rise
    # One time constant covers 1 - 1/e of the step, exactly (the exponential solution, not Euler).
    assert temps[0] == pytest.approx(30.0 + 40.0 * (1 - math.exp(-1)))
    assert temps[-1] == pytest.approx(70.0, abs=0.2)


def test_idle_cools_back_to_ambient() -> None:
    clock, load = FakeClock(), Load(0.0)
    source = make(load, clock, ambient_c=30.0, time_constant_s=10.0, initial_temperature_c=80.0)
    clock.now += 10.0
    first = source.read()[0].temperature_c
    assert first == pytest.approx(30.0 + 50.0 * math.exp(-1))
    clock.now += 100.0
    assert source.read()[0].temperature_c == pytest.approx(30.0, abs=0.01)


def test_no_elapsed_time_means_no_change() -> None:
    clock, load = FakeClock(), Load(1.0)
    source = make(load, clock, initial_temperature_c=50.0)
    assert source.read()[0].temperature_c == 50.0


@pytest.mark.parametrize(
    ("temperature_c", "reasons", "clock_mhz"),
    [
        (60.0, 0, 1980.0),  # cool: full clock
        (87.0, 0, 1980.0),  # at the slowdown threshold, not above it
        (88.0, SW, 1980.0 - 990.0 * 0.2),  # one fifth of the way to shutdown
        (89.5, SW, 1980.0 - 990.0 * 0.5),
        (90.0, SW | HW, 1980.0 - 990.0 * 0.6),  # slowdown + 3 C hardware margin
        (92.0, SW | HW, 990.0),  # at shutdown: minimum clock
        (99.0, SW | HW, 990.0),  # clamped past shutdown
    ],
)
def test_throttle_bits_and_clock(temperature_c: float, reasons: int, clock_mhz: float) -> None:
    source = make(Load(0.5), FakeClock(), initial_temperature_c=temperature_c)
    reading = source.read()[0]
    assert reading.clock_event_reasons == reasons
    assert reading.sm_clock_mhz == pytest.approx(clock_mhz)
    assert reading.sm_clock_max_mhz == 1980.0
    assert (reading.slowdown_temperature_c, reading.shutdown_temperature_c) == (87.0, 92.0)


def test_sustained_full_load_with_defaults_crosses_slowdown() -> None:
    clock, load = FakeClock(), Load(1.0)
    source = make(load, clock)
    clock.now += 600.0
    reading = source.read()[0]
    assert reading.temperature_c == pytest.approx(88.0, abs=0.01)
    assert reading.clock_event_reasons == SW
    assert reading.sm_clock_mhz < reading.sm_clock_max_mhz


@pytest.mark.parametrize(
    ("utilization", "power_w", "reported"),
    [(0.0, 75.0, 0.0), (0.5, 387.5, 0.5), (1.0, 700.0, 1.0), (1.7, 700.0, 1.0), (-0.2, 75.0, 0.0)],
)
def test_power_follows_utilization(utilization: float, power_w: float, reported: float) -> None:
    reading = make(Load(utilization), FakeClock()).read()[0]
    assert reading.power_w == pytest.approx(power_w)
    assert reading.power_limit_w == 700.0
    assert reading.utilization == reported


def test_nan_load_counts_as_idle() -> None:
    assert make(Load(float("nan")), FakeClock()).read()[0].utilization == 0.0


def test_every_reading_is_labelled_simulated() -> None:
    clock = FakeClock()
    source = make(Load(0.3), clock, gpu_count=4)
    for _ in range(3):
        clock.now += 1.0
        readings = source.read()
        assert [r.gpu_index for r in readings] == [0, 1, 2, 3]
        assert {r.source for r in readings} == {SampleSource.SIMULATED}
        assert {r.to_proto().source for r in readings} == {telemetry_pb2.TELEMETRY_SOURCE_SIMULATED}


def test_to_proto_keeps_units() -> None:
    reading = make(Load(1.0), FakeClock(), initial_temperature_c=88.0).read()[0]
    proto = reading.to_proto()
    assert proto.power_w == reading.power_w == 700.0
    assert proto.timestamp_s == 1.7e9
    assert proto.clock_event_reasons == SW
    assert proto.memory_total_bytes == SimulatedGpuSettings().memory_total_bytes
    assert proto.memory_used_bytes == int(proto.memory_total_bytes * 0.9)


def test_settings_from_env() -> None:
    settings = TelemetrySettings.from_env(
        {
            "HANZO_TELEMETRY_NODE_ID": "node-7",
            "HANZO_TELEMETRY_SOURCE": "Simulated",
            "HANZO_TELEMETRY_GPU_INDEX": "2",
            "HANZO_TELEMETRY_INTERVAL_S": "0.25",
            "HANZO_TELEMETRY_PROBE_IDLE_UTILIZATION": "0",
            "HANZO_TELEMETRY_SIM_AMBIENT_C": "25",
            "HANZO_TELEMETRY_SIM_GPU_COUNT": "8",
            "HANZO_TELEMETRY_SIM_HEATING_C_AT_FULL_LOAD": "",  # blank keeps the default
        }
    )
    assert (settings.node_id, settings.source, settings.gpu_index) == ("node-7", "simulated", 2)
    assert settings.stream.interval_s == 0.25
    assert settings.probe.idle_utilization == 0.0
    assert (settings.sim.ambient_c, settings.sim.gpu_count) == (25.0, 8)
    assert settings.sim.heating_c_at_full_load == SimulatedGpuSettings().heating_c_at_full_load


def test_defaults_need_no_env() -> None:
    settings = TelemetrySettings.from_env({})
    assert settings.node_id and settings.source == "auto" and settings.gpu_index is None
    assert settings.stream.interval_s == 1.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HANZO_TELEMETRY_INTERVAL_S", "fast"),
        ("HANZO_TELEMETRY_INTERVAL_S", "0"),
        ("HANZO_TELEMETRY_SOURCE", "gpu"),
        ("HANZO_TELEMETRY_GPU_INDEX", "-1"),
        ("HANZO_TELEMETRY_BACKOFF_JITTER", "1.5"),
        ("HANZO_TELEMETRY_PROBE_TIMEOUT_S", "-2"),
        ("HANZO_TELEMETRY_SIM_SHUTDOWN_C", "80"),
        ("HANZO_TELEMETRY_SIM_GPU_COUNT", "1.5"),
    ],
)
def test_bad_setting_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        TelemetrySettings.from_env({name: value})
