"""The real no-NVML path on a machine without a driver (nothing mocked), and NVML itself where it exists."""

from __future__ import annotations

import logging

import pynvml
import pytest

from services.telemetry.config import SourceKind, TelemetrySettings
from services.telemetry.nvml_source import NvmlSource, or_zero
from services.telemetry.sample import SampleSource
from services.telemetry.simulated_source import SimulatedSource
from services.telemetry.sources import SourceUnavailableError, open_source


def _nvml_available() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


HAS_NVML = _nvml_available()
no_nvml_only = pytest.mark.skipif(HAS_NVML, reason="this machine has NVML; the fallback path cannot run")
nvml_only = pytest.mark.skipif(not HAS_NVML, reason="no NVML driver on this machine")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


@no_nvml_only
def test_nvml_source_raises_without_a_driver() -> None:
    with pytest.raises(pynvml.NVMLError):
        NvmlSource()


@no_nvml_only
def test_auto_falls_back_to_simulated_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    source = open_source(TelemetrySettings(source=SourceKind.AUTO), lambda: 0.5)
    try:
        assert isinstance(source, SimulatedSource)
        (warning,) = _warnings(caplog)
        assert "no NVML" in warning.getMessage()
        assert "SIMULATED thermal source" in warning.getMessage()
        readings = source.read()
        assert readings and all(r.source is SampleSource.SIMULATED for r in readings)
        assert len(_warnings(caplog)) == 1  # reading does not warn again
    finally:
        source.close()


@no_nvml_only
def test_auto_fallback_keeps_the_gpu_index() -> None:
    source = open_source(TelemetrySettings(gpu_index=3), lambda: 0.0)
    assert [r.gpu_index for r in source.read()] == [3]


@no_nvml_only
def test_nvml_required_without_a_driver_is_a_clear_error() -> None:
    with pytest.raises(SourceUnavailableError, match="HANZO_TELEMETRY_SOURCE=nvml but NVML is unavailable"):
        open_source(TelemetrySettings(source=SourceKind.NVML), lambda: 0.0)


def test_simulated_on_request_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    source = open_source(TelemetrySettings(source=SourceKind.SIMULATED), lambda: 0.0)
    assert isinstance(source, SimulatedSource)
    assert _warnings(caplog) == []


def test_unsupported_query_reads_zero() -> None:
    def unsupported(*_: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def broken(*_: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    assert or_zero(unsupported, "handle") == 0
    assert or_zero(lambda h, s: 41, "handle", 0) == 41
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # only "not supported" means zero
        or_zero(broken, "handle")


@nvml_only
def test_nvml_readings_are_real_and_labelled() -> None:
    source = NvmlSource()
    try:
        readings = source.read()
        assert readings and all(r.source is SampleSource.NVML for r in readings)
        for r in readings:
            assert 0 <= r.utilization <= 1
            assert r.memory_total_bytes > 0 and r.temperature_c > 0
        assert source.describe()["driver_version"]
    finally:
        source.close()
        source.close()  # idempotent


@nvml_only
def test_open_source_auto_picks_nvml() -> None:
    source = open_source(TelemetrySettings(), lambda: 0.0)
    try:
        assert isinstance(source, NvmlSource)
    finally:
        source.close()
