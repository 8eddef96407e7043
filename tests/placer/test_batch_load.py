"""A heartbeat's batch counts reach the snapshot, and the placer's own BATCH picks count as batch waiting
until the next heartbeat (what batch_isolation reads), through the placer's ClusterState."""

from __future__ import annotations

import pytest

from hanzo.inference.v1 import cluster_state_pb2
from services.common.workload import WorkloadClass
from services.placer.cluster.state import ClusterState
from tests.placer.cluster_helpers import node_report

NOW = 1_700_000_000.0


def _state_with(batch_running: int, batch_waiting: int) -> ClusterState:
    state = ClusterState(clock=lambda: NOW)
    report = node_report("w1", running=5, waiting=3)
    report.load.batch_running = batch_running
    report.load.batch_waiting = batch_waiting
    state.apply_node(cluster_state_pb2.NodeEntry(report=report, deadline_s=NOW + 3))
    return state


@pytest.mark.parametrize(
    ("picked", "waiting", "batch_waiting"),
    [
        (WorkloadClass.BATCH, 4, 3),
        (WorkloadClass.REALTIME_CHAT, 4, 2),
        (WorkloadClass.UNSPECIFIED, 4, 2),
    ],
)
def test_picks_count_as_waiting_and_batch_ones_as_batch(
    picked: WorkloadClass, waiting: int, batch_waiting: int
) -> None:
    state = _state_with(batch_running=4, batch_waiting=2)
    snapshot = state.snapshot
    row = snapshot.row_of["w1"]
    assert (snapshot.batch_running[row], snapshot.batch_waiting[row]) == (4, 2)
    state.record_pick(row, picked)
    assert (snapshot.waiting[row], snapshot.batch_waiting[row]) == (waiting, batch_waiting)


def test_the_next_heartbeat_replaces_the_placers_own_count() -> None:
    state = _state_with(batch_running=1, batch_waiting=0)
    row = state.snapshot.row_of["w1"]
    state.record_pick(row, WorkloadClass.BATCH)
    report = node_report("w1", running=6, waiting=0)
    report.load.batch_running = 2
    state.apply_node(cluster_state_pb2.NodeEntry(report=report, deadline_s=NOW + 4))
    assert (state.snapshot.batch_running[row], state.snapshot.batch_waiting[row]) == (2, 0)
