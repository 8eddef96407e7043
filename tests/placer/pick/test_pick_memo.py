"""The Picker's memoized rankings: the same decisions as ranking afresh, invalidated by every snapshot
write and by a heartbeat deadline passing, with ties still broken at random on every lookup."""

from __future__ import annotations

from collections import Counter

import numpy as np

from services.common.workload import WorkloadClass
from services.placer.pick import ClassWeights, Picker
from tests.placer.pick.helpers import NOW, node, query, snapshot_of

RESIDENT = {"models": {"llama-8b": "resident"}}


def _picker(seed: int, memo_capacity: int = 256) -> Picker:
    return Picker(ClassWeights.defaults(), rng=np.random.default_rng(seed), memo_capacity=memo_capacity)


def test_memoized_decisions_equal_fresh_ones_through_writes_and_time() -> None:
    rng = np.random.default_rng(7)
    specs = [
        {"id": f"n{i}", **RESIDENT, "running": int(rng.integers(0, 3)), "temp": float(rng.integers(40, 88)),
         "zone": f"z{i % 2}", "deadline": float(rng.integers(5, 30))}
        for i in range(8)
    ]  # fmt: skip
    memoized, fresh = _picker(seed=1), _picker(seed=1, memo_capacity=0)
    snapshot = snapshot_of(*specs)
    for step in range(300):
        if step % 40 == 39:  # a heartbeat: one node's load changes
            spec = specs[step % len(specs)]
            spec["running"] = int(rng.integers(0, 3))
            snapshot.upsert(node(**{k: v for k, v in spec.items() if k != "id"}, node_id=spec["id"]))
        workload_class = [WorkloadClass.REALTIME_CHAT, WorkloadClass.BATCH][step % 2]
        q = query(
            workload_class, now_s=NOW + step / 10, prefix_hash=step % 5 or None, caller_zone="z1",
            exclude=frozenset({"n3"}) if step % 3 == 0 else frozenset(),
        )  # fmt: skip
        a, b = memoized.pick(snapshot, q), fresh.pick(snapshot, q)
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert (a.node_id, a.total, a.candidates, a.last_resort) == (
                b.node_id, b.total, b.candidates, b.last_resort
            )  # fmt: skip
    assert memoized.memo_hits > 150
    assert fresh.memo_hits == 0


def test_ties_are_broken_at_random_on_every_lookup() -> None:
    snapshot = snapshot_of(*({"id": name, **RESIDENT} for name in ("a", "b", "c")))
    picker = _picker(seed=3)
    counts = Counter(picker.pick(snapshot, query()).node_id for _ in range(300))  # type: ignore[union-attr]
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) > 50
    assert picker.memo_hits == 299


def test_a_snapshot_write_is_seen_by_the_next_pick() -> None:
    snapshot = snapshot_of({"id": "a", **RESIDENT}, {"id": "b", **RESIDENT, "running": 32})
    picker = _picker(seed=0)
    assert picker.pick(snapshot, query()).node_id == "a"  # type: ignore[union-attr]
    snapshot.upsert(node("a", **RESIDENT, running=64, waiting=64, kv=0.9))
    assert picker.pick(snapshot, query()).node_id == "b"  # type: ignore[union-attr]


def test_a_passing_deadline_is_seen_without_a_write() -> None:
    # "a" is preferred but its heartbeat expires 5 s after NOW; nothing writes the snapshot.
    snapshot = snapshot_of({"id": "a", **RESIDENT, "deadline": 5}, {"id": "b", **RESIDENT, "running": 32})
    picker = _picker(seed=0)
    at = [NOW, NOW + 4.9, NOW + 5.0, NOW + 6, NOW + 1]  # and back: a clock that steps backwards
    chosen = [picker.pick(snapshot, query(now_s=now)).node_id for now in at]  # type: ignore[union-attr]
    assert chosen == ["a", "a", "b", "b", "a"]
