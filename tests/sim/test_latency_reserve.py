"""The latency-reserve experiment (sim/latency_reserve.py): how the reserve is sized from heartbeats, and
how its policy routes batch around it and latency work onto it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.common.workload import WorkloadClass
from services.placer.cluster.state import ClusterState
from sim.latency_reserve import RESIZE_S, START_SHARE, LatencyReserve, ours_reserve, reserve_weights
from sim.policies import Choice
from tests.placer.pick.helpers import MODEL, NOW, query, snapshot_of

SEATS = 10.0


def _node(choice: Choice | None) -> str | None:
    return None if choice is None else choice.node_id


def _fleet(n: int, batch: list[int] | None = None, latency: list[int] | None = None) -> ClusterState:
    """n nodes holding MODEL; node i with batch[i] batch and latency[i] latency requests running."""
    batch = batch or [0] * n
    latency = latency or [0] * n
    nodes = [
        {"id": f"n{i}", "models": {MODEL: "resident"}, "running": batch[i] + latency[i],
         "batch_running": batch[i], "max_running": 256}
        for i in range(n)
    ]  # fmt: skip
    state = ClusterState(clock=lambda: NOW)
    state.snapshot = snapshot_of(*nodes)
    return state


def test_the_reserve_starts_on_the_nodes_with_least_batch() -> None:
    batch = [9, 0, 5, 0, 7, 3, 8, 6, 4, 2] * 2
    state = _fleet(20, batch)
    reserve = LatencyReserve(MODEL, SEATS)
    reserve.update(state.snapshot, NOW)
    assert len(reserve.ids) == max(1, int(20 * START_SHARE))
    assert reserve.ids == {"n1"}  # the first of the batch-free nodes


@pytest.mark.parametrize(
    ("latency_on_reserve", "size_after"),
    [
        (4 * SEATS, 4),  # four times the target on one node: three more nodes
        (SEATS, 1),  # within the band: unchanged
        (0.0, 1),  # below it, but a reserve keeps one node
    ],
)
def test_the_reserve_grows_by_its_excess_and_keeps_its_size_in_the_band(
    latency_on_reserve: float, size_after: int
) -> None:
    n = 20
    batch = [5] * n
    batch[3] = 0  # the reserve's first node
    batch[7], batch[11], batch[15] = 1, 2, 3  # the next least batch-loaded
    reserve = LatencyReserve(MODEL, SEATS)
    reserve.update(_fleet(n, batch).snapshot, NOW)
    assert reserve.ids == {"n3"}
    latency = [0] * n
    latency[3] = int(latency_on_reserve)
    reserve.update(_fleet(n, batch, latency).snapshot, NOW + RESIZE_S / 2)  # too soon: nothing changes
    assert reserve.ids == {"n3"}
    reserve.update(_fleet(n, batch, latency).snapshot, NOW + RESIZE_S)
    assert len(reserve.ids) == size_after
    assert reserve.ids <= {"n3", "n7", "n11", "n15"}


def test_an_idle_reserve_gives_back_its_least_busy_nodes() -> None:
    latency = [1] * 20 + [0] * 20
    latency[0] = 0  # the least busy of the reserve
    reserve = LatencyReserve(MODEL, SEATS, ids=frozenset(f"n{i}" for i in range(20)))
    reserve.update(_fleet(40, latency=latency).snapshot, NOW)
    assert len(reserve.ids) == 19 and "n0" not in reserve.ids


def test_batch_goes_around_the_reserve_and_latency_work_onto_it() -> None:
    # The reserve's nodes in their band (so it stays as it is) and far less busy than the rest, which
    # batch would prefer if nothing kept it away.
    seats = int(SEATS)
    state = _fleet(6, batch=[200, 200, 0, 200, 0, 200], latency=[0, 0, seats, 0, seats, 0])
    reserve = LatencyReserve(MODEL, SEATS, ids=frozenset({"n2", "n4"}))
    choose = ours_reserve(0, reserve_weights({}), reserve)
    for k in range(30):
        now = NOW + k * 1e-3
        assert _node(choose(state, query(WorkloadClass.BATCH, now_s=now))) not in reserve.ids
        assert _node(choose(state, query(WorkloadClass.REALTIME_CHAT, now_s=now))) in reserve.ids
    assert reserve.ids == {"n2", "n4"}
    # Where nothing but the reserve can take it, batch still goes there rather than nowhere.
    others = frozenset(f"n{i}" for i in range(6)) - reserve.ids
    only_reserve = replace(query(WorkloadClass.BATCH, now_s=NOW), exclude=others)
    assert _node(choose(state, only_reserve)) in reserve.ids


def test_the_weights_add_the_reserve_for_the_latency_classes_only() -> None:
    weights = reserve_weights({"realtime_chat": {"prefix_affinity": 0.2}, "BATCH": {"load": 0.5}})
    chat, agent = weights.for_class(WorkloadClass.REALTIME_CHAT), weights.for_class(WorkloadClass.AGENT_TOOL)
    assert chat["reserve"] == agent["reserve"] == 0.5
    assert chat["prefix_affinity"] == 0.2 and agent["prefix_affinity"] == 0.5  # an override wins
    assert "reserve" not in weights.for_class(WorkloadClass.BATCH)
    assert weights.for_class(WorkloadClass.BATCH)["load"] == 0.5
