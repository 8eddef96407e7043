"""The node reserve (scorers.node_reserve): which nodes it keeps for the latency classes, what each class
scores there, and where a Picker that weighs it sends batch and chat."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.workload import WorkloadClass
from services.placer.cluster.reserve import reserve_rank
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick import ClassWeights, Picker
from services.placer.pick.query import NO_CONTEXT
from services.placer.pick.scorers import ScorerConfig, build_scorers, evaluate, node_reserve
from tests.placer.pick.helpers import MODEL, by_id, node, query, snapshot_of


def _ids(reserved: bool, count: int, fraction: float = ScorerConfig.node_reserve_fraction) -> list[str]:
    """count node ids inside (reserved) or outside the reserve of that fraction."""
    found = []
    for i in range(10_000):
        node_id = f"gpu-{i}"
        if (reserve_rank(node_id) < fraction) == reserved:
            found.append(node_id)
            if len(found) == count:
                return found
    raise AssertionError("no such ids among 10,000")


def test_reserve_rank_is_a_stable_uniform_hash_of_the_node_id() -> None:
    ranks = np.array([reserve_rank(f"node{i:04d}-gpu{i % 8}") for i in range(8000)])
    assert ((ranks >= 0.0) & (ranks < 1.0)).all()
    assert reserve_rank("node0001-gpu1") == reserve_rank("node0001-gpu1")
    # A quarter of 8,000 ids below 0.25, within a few standard deviations (about 39).
    assert abs(int((ranks < 0.25).sum()) - 2000) < 200
    assert len(set(ranks.tolist())) == ranks.size


def test_a_row_carries_its_node_rank_and_a_recycled_row_takes_the_new_one() -> None:
    snapshot = ClusterSnapshot(capacity=2)
    for node_id in ("a", "b", "c"):  # the third grows the columns
        snapshot.upsert(node(node_id))
    assert by_id(snapshot, snapshot.reserve_rank) == {n: reserve_rank(n) for n in ("a", "b", "c")}
    row = snapshot.row_of["b"]
    snapshot.remove("b")
    snapshot.upsert(node("d"))
    assert snapshot.row_of["d"] == row
    assert snapshot.reserve_rank[row] == reserve_rank("d")


@pytest.mark.parametrize(
    ("workload_class", "inside", "outside"),
    [
        (WorkloadClass.BATCH, 0.0, 1.0),
        (WorkloadClass.REALTIME_CHAT, 1.0, 0.0),
        (WorkloadClass.AGENT_TOOL, 1.0, 0.0),
        (WorkloadClass.EMBEDDING, 1.0, 0.0),
    ],
)
def test_batch_scores_off_the_reserve_and_the_others_on_it(
    workload_class: WorkloadClass, inside: float, outside: float
) -> None:
    reserved, free = _ids(True, 1)[0], _ids(False, 1)[0]
    snapshot = snapshot_of({"id": reserved}, {"id": free})
    values = evaluate(build_scorers()["node_reserve"], snapshot, query(workload_class), NO_CONTEXT)
    assert by_id(snapshot, values) == {reserved: inside, free: outside}


@pytest.mark.parametrize(("fraction", "reserved"), [(0.0, 0), (1.0, 6)])
def test_the_fraction_bounds_the_reserve(fraction: float, reserved: int) -> None:
    snapshot = snapshot_of(*({"id": f"n{i}"} for i in range(6)))
    chat = node_reserve(snapshot, query(), slice(0, 6), config=ScorerConfig(node_reserve_fraction=fraction))
    assert int(chat.sum()) == reserved


def _picker(compiled: bool) -> Picker:
    """The default weights, and node_reserve weighed above everything else for batch and at 0.3 for chat."""
    reserve = {"BATCH": {"node_reserve": 1.0}, "REALTIME_CHAT": {"node_reserve": 0.3}}
    weights = ClassWeights.from_config(reserve)
    return Picker(weights, scorers=build_scorers(), rng=np.random.default_rng(0), compiled=compiled)


@pytest.mark.parametrize("compiled", [True, False])
def test_batch_spills_into_the_reserve_only_when_nothing_outside_it_passes(compiled: bool) -> None:
    reserved, free = _ids(True, 2), _ids(False, 2)
    resident = {"models": {MODEL: "resident"}}
    # Outside the reserve: busy and hot, but able to take work; inside: idle and cool.
    busy = {"running": 60, "kv": 0.9, "temp": 80.0, **resident}
    idle = {"temp": 40.0, **resident}
    snapshot = snapshot_of(*({"id": n, **busy} for n in free), *({"id": n, **idle} for n in reserved))
    picker = _picker(compiled)
    for _ in range(20):
        batch = picker.pick(snapshot, query(WorkloadClass.BATCH))
        assert batch is not None and batch.node_id in free
        chat = picker.pick(snapshot, query())
        assert chat is not None and chat.node_id in reserved
    # Every node outside the reserve full of KV (the memory filter refuses them): batch takes the reserve.
    for node_id in free:
        snapshot.upsert(node(node_id, **{**busy, "kv": 0.99}))
    batch = picker.pick(snapshot, query(WorkloadClass.BATCH))
    assert batch is not None and batch.node_id in reserved


def test_no_class_weighs_the_reserve_by_default() -> None:
    defaults = ClassWeights.defaults()
    assert all("node_reserve" not in defaults.for_class(wc) for wc in WorkloadClass)
