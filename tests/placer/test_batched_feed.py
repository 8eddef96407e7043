"""ClusterState.apply_loads / apply_samples (many nodes' load-only heartbeats and GPU samples at once, as
the fleet simulator feeds them) leave the snapshot exactly as the same beats and samples do one node at
a time through apply_node / thermal_entry + apply_thermal, and a Picker reading it picks the same."""

from __future__ import annotations

import numpy as np
import pytest

from hanzo.inference.v1 import cluster_state_pb2, telemetry_pb2
from services.common.workload import WorkloadClass
from services.placer.cluster import snapshot as snapshot_module
from services.placer.cluster.batches import LoadBatch, ThermalBatch
from services.placer.cluster.state import ClusterState
from services.placer.pick.framework import Picker
from services.placer.pick.query import PickQuery
from services.placer.pick.weights import ClassWeights
from tests.placer.cluster_helpers import gpu_sample, node_report

NOW = 1_700_000_000.0
NODES = ("w0", "w1", "w2", "w3")
# Each step: (seconds after NOW, per node (running, waiting, kv_usage, batch_running, temperature_c)).
# duplicate_beat repeats a time (its heartbeats are skipped as stale; its samples keep the trend).
STEPS = {
    "warming": [
        (1.0, [(1, 0, 0.1, 0, 60.0), (4, 2, 0.5, 1, 70.0), (0, 0, 0.0, 0, 55.0), (9, 5, 0.9, 3, 84.0)]),
        (2.0, [(2, 1, 0.2, 1, 63.5), (4, 0, 0.4, 0, 72.0), (1, 0, 0.1, 0, 55.5), (9, 7, 0.95, 4, 86.0)]),
        (3.0, [(0, 0, 0.0, 0, 61.0), (5, 3, 0.6, 2, 75.0), (30, 20, 0.9, 6, 54.0), (8, 8, 0.97, 4, 88.0)]),
    ],
    "duplicate_beat": [
        (1.0, [(1, 0, 0.1, 0, 60.0), (4, 2, 0.5, 1, 70.0), (0, 0, 0.0, 0, 55.0), (9, 5, 0.9, 3, 84.0)]),
        (1.0, [(3, 3, 0.3, 2, 61.0), (6, 1, 0.7, 2, 71.0), (2, 2, 0.2, 1, 56.0), (7, 4, 0.8, 2, 85.0)]),
        (2.0, [(0, 0, 0.0, 0, 61.0), (0, 0, 0.0, 0, 62.0), (40, 30, 0.99, 9, 56.0), (7, 4, 0.8, 2, 85.0)]),
    ],
}


def _registered() -> ClusterState:
    """Every node known through its first, full heartbeat and sample (as the simulator registers them)."""
    state = ClusterState(clock=lambda: NOW)
    for i, node_id in enumerate(NODES):
        state.apply_node(
            cluster_state_pb2.NodeEntry(report=node_report(node_id, zone=f"z{i % 2}"), deadline_s=NOW)
        )
        state.apply_thermal(node_id, state.thermal_entry(node_id, gpu_sample(50.0 + i, timestamp_s=NOW)))
    return state


def _one_at_a_time(state: ClusterState, t: float, nodes: list[tuple]) -> None:
    for i, (running, waiting, kv, batch_running, temperature) in enumerate(nodes):
        report = node_report(NODES[i], zone=f"z{i % 2}", running=running, waiting=waiting, kv_usage=kv)
        report.load.batch_running = batch_running
        report.load.batch_waiting = waiting
        report.load.latency_prompt_tokens = 100 * running
        state.apply_node(cluster_state_pb2.NodeEntry(report=report, deadline_s=NOW + t + 3))
        sample = gpu_sample(temperature, timestamp_s=NOW + t, reasons=int(temperature > 85))
        state.apply_thermal(NODES[i], state.thermal_entry(NODES[i], sample))


def _batched(state: ClusterState, t: float, nodes: list[tuple]) -> None:
    rows = np.array([state.snapshot.row_of[n] for n in NODES])
    running, waiting, kv, batch_running, temperature = (
        np.array(c, dtype=float) for c in zip(*nodes, strict=True)
    )
    template = node_report("any")
    state.apply_loads(
        LoadBatch(
            rows=rows,
            deadline_s=np.full(len(NODES), NOW + t + 3),
            running=running,
            waiting=waiting,
            max_running=template.load.max_running,
            batch_running=batch_running,
            batch_waiting=waiting,
            latency_prompt_tokens=100 * running,
            kv_usage=kv,
            memory_free_bytes=template.gpu.memory_free_bytes,
        )
    )
    sample = gpu_sample(0.0)
    state.apply_samples(
        ThermalBatch(
            rows=rows,
            timestamp_s=np.full(len(NODES), NOW + t),
            temperature_c=temperature,
            simulated=sample.source == telemetry_pb2.TELEMETRY_SOURCE_SIMULATED,
            slowdown_temperature_c=sample.slowdown_temperature_c,
            shutdown_temperature_c=sample.shutdown_temperature_c,
            clock_event_reasons=(temperature > 85).astype(np.uint64),
            power_w=sample.power_w,
            power_limit_w=sample.power_limit_w,
            sm_clock_mhz=sample.sm_clock_mhz,
            sm_clock_max_mhz=sample.sm_clock_max_mhz,
            utilization=sample.utilization,
        )
    )


def _columns(state: ClusterState) -> dict[str, list]:
    snapshot = state.snapshot
    names = (*snapshot_module._FLOAT_COLUMNS, *snapshot_module._BOOL_COLUMNS, "clock_event_reasons")
    return {name: snapshot.column(name).tolist() for name in names}


@pytest.mark.parametrize("case", sorted(STEPS))
def test_batched_writes_leave_the_snapshot_as_one_at_a_time(case: str) -> None:
    single, batched = _registered(), _registered()
    for t, nodes in STEPS[case]:
        _one_at_a_time(single, t, nodes)
        _batched(batched, t, nodes)
        assert _columns(batched) == _columns(single), f"after t={t}"
    assert (batched.snapshot.temperature_trend_c_per_s[: len(NODES)] != 0).any()  # trends were smoothed


@pytest.mark.parametrize("case", sorted(STEPS))
def test_a_picker_reading_batched_writes_picks_the_same(case: str) -> None:
    states = {"single": _registered(), "batched": _registered()}
    pickers = {name: Picker(ClassWeights.defaults(), rng=np.random.default_rng(0)) for name in states}
    picked: dict[str, list[str | None]] = {name: [] for name in states}
    for t, nodes in STEPS[case]:
        _one_at_a_time(states["single"], t, nodes)
        _batched(states["batched"], t, nodes)
        for name, state in states.items():
            for workload in (WorkloadClass.REALTIME_CHAT, WorkloadClass.BATCH):
                query = PickQuery(model="llama-tiny", workload_class=workload, now_s=NOW + t)
                result = pickers[name].pick(state.snapshot, query)  # incremental: the rows written since
                picked[name].append(None if result is None else result.node_id)
    assert picked["batched"] == picked["single"]
    assert len(set(picked["single"])) > 1  # the load moved the choice
