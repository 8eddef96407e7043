"""The agent's /metrics in dcgm-exporter's names, labels and units: one series per GPU and field, a GPU
that stops reporting removed; and a real agent process serving them on its metrics port."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.common.redis_server import free_port
from services.mesh.process import start_service
from services.telemetry.dcgm_metrics import FIELDS, DcgmMetrics
from services.telemetry.sample import GpuReading, SampleSource
from tests.placer.cluster_helpers import eventually


def _reading(index: int, source: SampleSource = SampleSource.NVML, **fields: object) -> GpuReading:
    values = {
        "timestamp_s": 1.0, "temperature_c": 71.0, "slowdown_temperature_c": 87.0,
        "shutdown_temperature_c": 92.0,
        "clock_event_reasons": 0x40, "power_w": 512.5, "power_limit_w": 700.0, "sm_clock_mhz": 1755.0,
        "sm_clock_max_mhz": 1980.0, "memory_used_bytes": 3 * 1024**3, "memory_total_bytes": 141 * 1024**3,
        "utilization": 0.875, "uuid": f"GPU-{index}-abc", "name": "NVIDIA H200",
    }  # fmt: skip
    return GpuReading(gpu_index=index, source=source, **{**values, **fields})  # type: ignore[arg-type]


def _samples(metrics: DcgmMetrics) -> dict[tuple[str, str], tuple[float, dict[str, str]]]:
    """(family, gpu) -> (value, labels)."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, s.labels["gpu"]): (s.value, s.labels)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_each_field_in_dcgm_exporters_units_and_labels() -> None:
    metrics = DcgmMetrics("host-a", "node-a")
    metrics.update([_reading(0), _reading(1, temperature_c=80.0)])
    samples = _samples(metrics)
    expected = {
        "DCGM_FI_DEV_GPU_TEMP": 71.0, "DCGM_FI_DEV_POWER_USAGE": 512.5, "DCGM_FI_DEV_SM_CLOCK": 1755.0,
        "DCGM_FI_DEV_GPU_UTIL": 87.5, "DCGM_FI_DEV_FB_USED": 3072.0, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 64.0,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": 700.0, "DCGM_FI_DEV_SLOWDOWN_TEMP": 87.0,
    }  # fmt: skip
    assert set(expected) == {f.name for f in FIELDS}
    for name, value in expected.items():
        assert samples[(name, "0")][0] == value, name
    assert samples[("DCGM_FI_DEV_GPU_TEMP", "1")][0] == 80.0
    assert samples[("DCGM_FI_DEV_GPU_TEMP", "0")][1] == {
        "gpu": "0", "UUID": "GPU-0-abc", "Hostname": "host-a", "modelName": "NVIDIA H200", "source": "nvml"
    }  # fmt: skip


def test_a_gpu_that_stops_reporting_has_its_series_removed() -> None:
    metrics = DcgmMetrics("host-a", "node-a")
    metrics.update([_reading(0), _reading(1)])
    metrics.update([_reading(1, temperature_c=60.0)])
    samples = _samples(metrics)
    assert {gpu for _, gpu in samples} == {"1"}
    assert len(samples) == len(FIELDS)  # one series per field for the one GPU left
    assert samples[("DCGM_FI_DEV_GPU_TEMP", "1")][0] == 60.0


def test_a_simulated_gpu_says_so_in_its_labels() -> None:
    metrics = DcgmMetrics("host-a", "node-a")
    metrics.update([_reading(2, SampleSource.SIMULATED, uuid="", name="")])
    labels = _samples(metrics)[("DCGM_FI_DEV_GPU_TEMP", "2")][1]
    assert (labels["UUID"], labels["modelName"], labels["source"]) == (
        "GPU-SIMULATED-node-a-2", "simulated GPU", "simulated"
    )  # fmt: skip


async def test_the_agent_serves_its_gpus_on_its_metrics_port(tmp_path: Path) -> None:
    env = {
        "HANZO_TELEMETRY_NODE_ID": "metrics-node",
        "HANZO_TELEMETRY_HOSTNAME": "rack1-host7",
        # Nothing listens there: the agent reads its GPUs on each attempt to stream, as with a placer.
        "HANZO_TELEMETRY_PLACER_ADDRESS": f"127.0.0.1:{free_port()}",
        "HANZO_TELEMETRY_SOURCE": "simulated",
        "HANZO_TELEMETRY_SIM_GPU_COUNT": "2",
        "HANZO_TELEMETRY_METRICS_PORT": "0",
    }
    agent = start_service("telemetry", "services.telemetry", env, "TELEMETRY_READY", tmp_path / "agent.log")
    try:
        url = f"http://127.0.0.1:{agent.ready['metrics_port']}/metrics"
        found: list[str] = []

        async def both_gpus() -> bool:
            text = urllib.request.urlopen(url, timeout=2).read().decode()
            found[:] = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
            return len(found) == 2

        await eventually(both_gpus, 20, "the agent's /metrics shows both simulated GPUs")
        assert all('Hostname="rack1-host7"' in line and 'source="simulated"' in line for line in found)
    finally:
        assert agent.stop() == 0
