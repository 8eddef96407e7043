"""A heartbeat that changes only the load takes ClusterState's fast path (ClusterSnapshot.update_load);
whatever a heartbeat changes, the node's row ends up as a fresh state's would after that heartbeat
alone, so the fast path can never keep a field it should have rewritten. Every field of NodeReport is
in the table below (a test fails when one is added without a row)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hanzo.inference.v1 import cluster_state_pb2, placer_pb2
from services.placer.cluster import snapshot as snapshot_module
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.cluster.state import ClusterState
from tests.placer.cluster_helpers import gpu_sample, node_report

NOW = 1_700_000_000.0
Change = Callable[[placer_pb2.NodeReport], None]


def _set_load(**fields: Any) -> Change:
    def change(report: placer_pb2.NodeReport) -> None:
        for name, value in fields.items():
            setattr(report.load, name, value)

    return change


def _add_model(report: placer_pb2.NodeReport) -> None:
    report.models.add(name="minilm", weight_bytes=90_000_000, resident=True)


CHANGES: dict[str, tuple[Change, bool]] = {  # name -> (the change, whether it is load only)
    "running": (_set_load(running=7), True),
    "waiting": (_set_load(waiting=3), True),
    "kv_usage": (_set_load(kv_usage=0.75), True),
    "max_running": (_set_load(max_running=128), True),
    "batch_counts": (_set_load(batch_running=2, batch_waiting=5), True),
    "memory_free": (lambda r: setattr(r.gpu, "memory_free_bytes", 3 << 30), True),
    "nothing": (lambda r: None, True),
    "address": (lambda r: setattr(r, "address", "10.0.0.9:50061"), False),
    "zone": (lambda r: setattr(r.topology, "zone", "z2"), False),
    "rack": (lambda r: setattr(r.topology, "rack", "r9"), False),
    "host": (lambda r: setattr(r.topology, "host", "elsewhere"), False),
    "gpu_name": (lambda r: setattr(r.gpu, "name", "H100"), False),
    "memory_total": (lambda r: setattr(r.gpu, "memory_total_bytes", 80 << 30), False),
    "model_evicted": (lambda r: setattr(r.models[0], "resident", False), False),
    "host_copy": (lambda r: setattr(r.models[0], "host_copy", True), False),
    "model_weight": (lambda r: setattr(r.models[0], "weight_bytes", 3 << 30), False),
    "model_added": (_add_model, False),
    "model_removed": (lambda r: r.ClearField("models"), False),
    "draining": (lambda r: setattr(r, "draining", True), False),
}
# Fields each row above covers, so a new NodeReport field cannot slip past the fast path's comparison.
COVERED = {"node_id", "address", "topology", "gpu", "models", "load", "draining"}


def _row(snapshot: ClusterSnapshot, node_id: str) -> dict[str, object]:
    """Everything the snapshot holds for node_id, label codes read back as labels."""
    row = snapshot.row_of[node_id]
    labels = {code: label for label, code in snapshot._codes.items()}
    columns = (*snapshot_module._FLOAT_COLUMNS, *snapshot_module._BOOL_COLUMNS, "clock_event_reasons")
    view: dict[str, object] = {name: getattr(snapshot, name)[row].item() for name in columns}
    view |= {name: labels.get(int(getattr(snapshot, name)[row])) for name in snapshot_module._CODE_COLUMNS}
    view["address"] = snapshot.addresses[row]
    view["models"] = {
        name: (bool(c.resident[row]), bool(c.host_copy[row]), c.weight_bytes)
        for name, c in snapshot.models.items()
        if c.resident[row] or c.host_copy[row]
    }
    return view


def _heartbeat(state: ClusterState, report: placer_pb2.NodeReport, deadline_s: float) -> None:
    state.apply_node(cluster_state_pb2.NodeEntry(report=report, deadline_s=deadline_s))


def test_every_field_of_a_heartbeat_has_a_row() -> None:
    assert {f.name for f in placer_pb2.NodeReport.DESCRIPTOR.fields} == COVERED


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_second_heartbeat_leaves_the_row_a_first_one_would(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    change, load_only = CHANGES[name]
    first = node_report("w1", running=1, waiting=0, kv_usage=0.1)
    second = placer_pb2.NodeReport()
    second.CopyFrom(first)
    change(second)

    state = ClusterState(clock=lambda: NOW)
    _heartbeat(state, first, NOW + 3)
    state.apply_thermal("w1", state.thermal_entry("w1", gpu_sample(61.0, timestamp_s=NOW)))
    state.record_pick(state.snapshot.row_of["w1"])  # the placer's own count, replaced by the beat
    upserts = []
    monkeypatch.setattr(state.snapshot, "upsert", _counting(state.snapshot.upsert, upserts))
    _heartbeat(state, second, NOW + 4)

    fresh = ClusterState(clock=lambda: NOW)
    fresh.apply_thermal("w1", state.thermal["w1"])  # unknown node: held for its first heartbeat
    _heartbeat(fresh, second, NOW + 4)
    assert _row(state.snapshot, "w1") == _row(fresh.snapshot, "w1")
    assert (len(upserts) == 0) == load_only, "the fast path takes exactly the load-only heartbeats"


def test_an_older_heartbeat_changes_nothing() -> None:
    state = ClusterState(clock=lambda: NOW)
    _heartbeat(state, node_report("w1", running=4), NOW + 4)
    _heartbeat(state, node_report("w1", running=9), NOW + 3)
    assert state.snapshot.running[state.snapshot.row_of["w1"]] == 4


def _counting(method: Callable[..., Any], calls: list[object]) -> Callable[..., Any]:
    def counted(*args: Any) -> Any:
        calls.append(args)
        return method(*args)

    return counted
