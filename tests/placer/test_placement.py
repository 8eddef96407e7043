"""Replica planning from demand: table-driven over small snapshots."""

from __future__ import annotations

import pytest

from services.placer.cluster.records import ModelInfo, NodeRecord
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.placement import desired_replicas, directives, plan_replicas

GIB = 1024**3
NOW = 1000.0


def node(node_id: str, models: dict[str, str], *, free_gib: float = 20, running: int = 0) -> NodeRecord:
    infos = tuple(ModelInfo(m, 10 * GIB, state == "resident", state == "host") for m, state in models.items())
    return NodeRecord(
        node_id=node_id, address="x", zone="z", rack="r", host=node_id, gpu_name="H200",
        memory_total_bytes=80 * GIB, memory_free_bytes=int(free_gib * GIB), models=infos,
        running=running, waiting=0, kv_usage=0.0, max_running=64, draining=False, deadline_s=NOW + 10,
    )  # fmt: skip


def snapshot_of(*records: NodeRecord) -> ClusterSnapshot:
    snapshot = ClusterSnapshot()
    for record in records:
        snapshot.upsert(record)
    return snapshot


@pytest.mark.parametrize(
    ("rate", "capacity", "eligible", "want"),
    [(0, 10, 5, 0), (0.1, 10, 5, 1), (10, 10, 5, 1), (10.5, 10, 5, 2), (100, 10, 5, 5), (5, 10, 0, 0)],
)
def test_desired_replicas(rate: float, capacity: float, eligible: int, want: int) -> None:
    assert desired_replicas(rate, capacity, eligible) == want


def test_growth_prefers_host_copy_then_free_memory_then_load() -> None:
    snapshot = snapshot_of(
        node("resident", {"m": "resident"}),
        node("roomy", {}, free_gib=60),
        node("host-copy", {"m": "host"}, free_gib=15),
        node("full", {}, free_gib=5),
        node("busy-roomy", {}, free_gib=60, running=50),
    )
    plan = plan_replicas(snapshot, {"m": 35.0}, capacity_rps=10.0, now_s=NOW)  # wants 4 replicas
    holders = {n for n, models in plan.desired.items() if "m" in models}
    assert holders == {"resident", "host-copy", "roomy", "busy-roomy"}
    assert "m" not in plan.desired["full"]  # 10 GiB of weights do not fit in 5 GiB
    assert plan.changed == {"host-copy", "roomy", "busy-roomy"}


def test_no_demand_changes_nothing_and_overprovision_shrinks_with_hysteresis() -> None:
    many = [node(f"n{i}", {"m": "resident"}, running=i) for i in range(5)]
    unchanged = plan_replicas(snapshot_of(*many), {}, 10.0, NOW)
    assert unchanged.desired == {f"n{i}": {"m"} for i in range(5)} and not unchanged.changed
    plan = plan_replicas(snapshot_of(*many), {"m": 5.0}, 10.0, NOW)  # needs 1, has 5 > 2 x 1
    assert [n for n, models in sorted(plan.desired.items()) if "m" in models] == ["n0"]  # least loaded stays
    assert plan.changed == {"n1", "n2", "n3", "n4"}
    plan = plan_replicas(snapshot_of(*many[:2]), {"m": 5.0}, 10.0, NOW)  # 2 <= 2 x 1: leave them
    assert all("m" in models for models in plan.desired.values()) and not plan.changed


def test_expired_and_unknown_are_skipped() -> None:
    stale = node("gone", {}, free_gib=60)
    stale = NodeRecord(**{**stale.__dict__, "deadline_s": NOW - 1})
    plan = plan_replicas(
        snapshot_of(stale, node("ok", {"m": "resident"})), {"m": 50.0, "unknown": 9.0}, 10.0, NOW
    )
    assert plan.desired == {"ok": {"m"}} and not plan.changed


@pytest.mark.parametrize(
    ("desired", "resident", "expected"),
    [
        (None, {"a"}, ([], [])),
        ({"a", "b"}, {"a"}, (["b"], [])),
        ({"b"}, {"a", "b"}, ([], ["a"])),
        (set(), set(), ([], [])),
    ],
)
def test_directives(
    desired: set[str] | None, resident: set[str], expected: tuple[list[str], list[str]]
) -> None:
    assert directives(desired, resident) == expected
