"""Replica planning from demand: table-driven over small snapshots."""

from __future__ import annotations

import pytest

from services.placer.cluster.records import ModelInfo, NodeRecord
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.config import PlacerSettings
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
        node("roomy", {"m": "cold"}, free_gib=60),
        node("host-copy", {"m": "host"}, free_gib=15),
        node("full", {"m": "cold"}, free_gib=5),
        node("busy-roomy", {"m": "cold"}, free_gib=60, running=50),
        node("not-in-its-catalog", {}, free_gib=80),
    )
    plan = plan_replicas(snapshot, {"m": 35.0}, capacity_rps=10.0, now_s=NOW)  # wants 4 replicas
    holders = {n for n, models in plan.desired.items() if "m" in models}
    assert holders == {"resident", "host-copy", "roomy", "busy-roomy"}
    assert "m" not in plan.desired["full"]  # 10 GiB of weights do not fit in 5 GiB
    assert "m" not in plan.desired["not-in-its-catalog"]  # a worker loads only what it lists
    assert plan.changed == {"host-copy", "roomy", "busy-roomy"}


def test_no_demand_changes_nothing_and_surplus_alone_is_never_evicted() -> None:
    many = [node(f"n{i}", {"m": "resident"}, running=i) for i in range(5)]
    unchanged = plan_replicas(snapshot_of(*many), {}, 10.0, NOW)
    assert unchanged.desired == {f"n{i}": {"m"} for i in range(5)} and not unchanged.changed
    # Needs 1 and has 5, but nothing wants the memory: evicting would only free bytes nobody uses.
    plan = plan_replicas(snapshot_of(*many), {"m": 5.0}, 10.0, NOW)
    assert all("m" in models for models in plan.desired.values()) and not plan.changed


@pytest.mark.parametrize(
    ("replicas_of_a", "rates", "holders_of_b", "holders_of_a"),
    [
        # a needs 1 of 5 (surplus 4); b needs 3 and fits nowhere: the three least loaded give up a.
        (5, {"a": 5.0, "b": 25.0}, {"n0", "n1", "n2"}, {"n3", "n4"}),
        # a needs 2 of 5 (5 > 2 x 2: surplus 3); b needs 5, gets the three a can spare.
        (5, {"a": 15.0, "b": 45.0}, {"n0", "n1", "n2"}, {"n3", "n4"}),
        # a needs 2 of 4 (4 <= 2 x 2, no surplus: hysteresis): b finds no room at all.
        (4, {"a": 15.0, "b": 45.0}, set(), {"n0", "n1", "n2", "n3"}),
    ],
)
def test_a_growing_model_takes_the_room_of_surplus_replicas(
    replicas_of_a: int, rates: dict[str, float], holders_of_b: set[str], holders_of_a: set[str]
) -> None:
    nodes = [
        node(f"n{i}", {"a": "resident", "b": "cold"}, free_gib=5, running=i) for i in range(replicas_of_a)
    ]
    plan = plan_replicas(snapshot_of(*nodes), rates, 10.0, NOW)
    assert {n for n, models in plan.desired.items() if "b" in models} == holders_of_b
    assert {n for n, models in plan.desired.items() if "a" in models} == holders_of_a
    assert plan.changed == holders_of_b


def test_expired_and_unknown_are_skipped() -> None:
    stale = node("gone", {"m": "cold"}, free_gib=60)
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


@pytest.mark.parametrize(("overrides", "holders"), [({}, 1), ({"big": 2.0}, 5), ({"other": 2.0}, 1)])
def test_a_model_capacity_overrides_the_default(overrides: dict[str, float], holders: int) -> None:
    """9 rps: one replica at the default 10 rps a replica, five where "big" serves 2 rps a replica."""
    nodes = [node("n0", {"big": "resident"})] + [node(f"n{i}", {"big": "cold"}) for i in range(1, 5)]
    plan = plan_replicas(snapshot_of(*nodes), {"big": 9.0}, 10.0, NOW, overrides)
    assert sum("big" in models for models in plan.desired.values()) == holders


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ('{"llama-70b": 1.5, "minilm": 400}', {"llama-70b": 1.5, "minilm": 400.0}),
        ("[1.5]", "must be a JSON object"),
        ("{llama: 1}", "is not JSON"),
        ('{"llama-70b": 0}', "must be a number of requests per second > 0"),
        ('{"llama-70b": "fast"}', "'llama-70b' must be a number"),
        ('{"llama-70b": true}', "must be a number"),
    ],
)
def test_model_capacities_from_the_environment(text: str, expected: dict[str, float] | str) -> None:
    environ = {"HANZO_PLACER_MODEL_CAPACITY_RPS": text}
    if isinstance(expected, dict):
        assert PlacerSettings.from_env(environ).model_capacity_rps == expected
    else:
        with pytest.raises(ValueError, match="HANZO_PLACER_MODEL_CAPACITY_RPS") as raised:
            PlacerSettings.from_env(environ)
        assert expected in str(raised.value)
