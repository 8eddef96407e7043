"""The Picker's incremental rankings (a RowTable per model and class, rescoring only the rows the
snapshot wrote since) decide exactly as rescoring every row on every pick, through heartbeats, thermal
samples, recorded picks, nodes leaving and joining, the snapshot growing, a new model, its log
dropping entries and time passing deadlines; ties are still broken at random on every pick."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from services.common.workload import WorkloadClass
from services.placer.cluster.records import ThermalSample
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick import ClassWeights, Picker
from tests.placer.pick.helpers import MODEL, NOW, node, query, snapshot_of

RESIDENT = {"models": {MODEL: "resident"}}
CLASSES = [WorkloadClass.REALTIME_CHAT, WorkloadClass.BATCH, WorkloadClass.AGENT_TOOL]


def _picker(seed: int, incremental: bool = True) -> Picker:
    return Picker(ClassWeights.defaults(), rng=np.random.default_rng(seed), incremental=incremental)


def _spec(rng: np.random.Generator, i: int) -> dict[str, object]:
    return {
        "models": {MODEL: str(rng.choice(["resident", "host", "cold"])), "qwen-7b": "cold"},
        "running": int(rng.integers(0, 64)), "waiting": int(rng.integers(0, 8)), "kv": float(rng.random()),
        "free_gb": float(rng.choice([0, 20, 40])), "temp": float(rng.integers(40, 92)),
        "reasons": int(rng.choice([0, 0, 0, 0x20, 0x4])), "zone": f"z{i % 3}", "rack": f"r{i % 5}",
        "host": f"h{i}", "deadline": float(rng.integers(5, 40)), "draining": bool(rng.random() < 0.05),
    }  # fmt: skip


def _sample(rng: np.random.Generator) -> ThermalSample:
    return ThermalSample(
        timestamp_s=NOW, simulated=False, temperature_c=float(rng.uniform(40, 95)),
        slowdown_temperature_c=90.0, shutdown_temperature_c=95.0,
        clock_event_reasons=int(rng.choice([0, 0x40])),
        power_w=300.0, power_limit_w=700.0, sm_clock_mhz=1800.0, sm_clock_max_mhz=1980.0, utilization=0.5,
    )  # fmt: skip


def _write(snapshot: ClusterSnapshot, rng: np.random.Generator, step: int, ids: list[str]) -> None:
    """One random write of each kind the snapshot takes."""
    kind = step % 6
    node_id = ids[int(rng.integers(len(ids)))]
    if kind in (0, 1):
        snapshot.upsert(node(node_id, **_spec(rng, len(ids))))
    elif kind == 2:
        snapshot.update_thermal(node_id, _sample(rng), float(rng.normal(0, 0.5)))
    elif kind == 3 and node_id in snapshot.row_of:
        snapshot.add_waiting(snapshot.row_of[node_id])
    elif kind == 4 and step % 24 == 4:
        snapshot.remove(node_id)
    elif kind == 5 and step % 60 == 5:
        ids.append(f"new{step}")  # a node joins (the snapshot grows past its capacity of 4 early on)
        snapshot.upsert(node(ids[-1], **_spec(rng, len(ids))))


@pytest.mark.parametrize("writes_per_pick", [0, 1, 3])
def test_incremental_decisions_equal_rescoring_every_row(writes_per_pick: int) -> None:
    rng = np.random.default_rng(7 + writes_per_pick)
    ids = [f"n{i}" for i in range(12)]
    snapshot = snapshot_of(*({"id": i, **_spec(rng, k)} for k, i in enumerate(ids)))
    incremental, fresh = _picker(seed=1), _picker(seed=1, incremental=False)
    decided = 0
    for step in range(400):
        for w in range(writes_per_pick):
            _write(snapshot, rng, step * writes_per_pick + w, ids)
        if step == 200:
            snapshot.upsert(node("q0", models={"qwen-7b": "resident", "gemma": "cold"}, weight_bytes=8 << 30))
        q = query(
            CLASSES[step % 3], model=[MODEL, "qwen-7b"][step % 7 == 0], now_s=NOW + step / 20,
            prefix_hash=step % 5 or None, caller_zone=f"z{step % 4}", caller_host=f"h{step % 9}",
            exclude=frozenset({ids[step % len(ids)]}) if step % 4 == 0 else frozenset(),
        )  # fmt: skip
        a, b = incremental.pick(snapshot, q), fresh.pick(snapshot, q)
        assert (a is None) == (b is None), step
        if a is not None and b is not None:
            decided += 1
            assert (a.node_id, a.total, a.considered, a.last_resort) == (
                b.node_id, b.total, b.considered, b.last_resort
            ), step  # fmt: skip
            assert a.candidates == b.candidates, step
            snapshot.add_waiting(a.row)  # as PlacerReplica.choose records every pick
    assert decided > 100
    assert incremental.rows_rescored > 0
    assert incremental.full_rescores < fresh.full_rescores


def test_a_reader_behind_the_trimmed_log_rescores_every_row() -> None:
    snapshot = snapshot_of({"id": "a", **RESIDENT}, {"id": "b", **RESIDENT})
    picker = _picker(seed=0)
    assert picker.pick(snapshot, query()) is not None
    sample = _sample(np.random.default_rng(0))
    for i in range(10_000):  # far more writes than the log keeps
        snapshot.update_thermal("ab"[i % 2], sample, 0.0)
    for _ in range(8):
        snapshot.add_waiting(snapshot.row_of["a"])
    full = picker.full_rescores
    assert picker.pick(snapshot, query()).node_id == "b"  # type: ignore[union-attr]
    assert picker.full_rescores == full + 1


def test_ties_are_broken_at_random_on_every_pick() -> None:
    snapshot = snapshot_of(*({"id": name, **RESIDENT} for name in ("a", "b", "c")))
    picker = _picker(seed=3)
    counts = Counter(picker.pick(snapshot, query()).node_id for _ in range(300))  # type: ignore[union-attr]
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) > 50
    assert picker.full_rescores == 1 and picker.rows_rescored == 0  # nothing was written after the first


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
