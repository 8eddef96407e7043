"""The placer's fleet GPU series come from its snapshot when scraped: one per live node with a sample,
gone as soon as the node leaves or its sample expires (not frozen at the last value)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.placer.gpu_metrics import FAMILIES, FleetGpuCollector
from tests.placer.pick.helpers import snapshot_of


def _series(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, s.labels["node_id"]): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_series_follow_the_snapshot_as_nodes_come_and_go() -> None:
    snapshot = snapshot_of(
        {"id": "hot", "temp": 84.0, "reasons": 0x20, "power": 650.0},
        {"id": "cool", "temp": 41.0},
        {"id": "unsampled"},
    )
    registry = CollectorRegistry()
    registry.register(FleetGpuCollector(lambda: snapshot))
    series = _series(registry)
    assert {node for _, node in series} == {"hot", "cool"}  # no sample, no series
    assert len(series) == 2 * len(FAMILIES)
    assert series[("hanzo_gpu_temperature_celsius", "hot")] == 84.0
    assert series[("hanzo_gpu_throttle_reasons", "hot")] == 0x20
    assert series[("hanzo_gpu_power_watts", "hot")] == 650.0
    snapshot.remove("hot")
    snapshot.update_thermal("cool", None, 0.0)  # its sample expired
    assert _series(registry) == {}
