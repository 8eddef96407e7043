"""The Picker's incremental rankings (a RowTable per model and class, rescoring only the rows the
snapshot wrote since) decide exactly as rescoring every row on every pick, through heartbeats, thermal
samples, recorded picks, nodes leaving and joining, the snapshot growing, a new model, its log
dropping entries and time passing deadlines; ties are still broken at random on every pick."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from services.placer.pick import ClassWeights, Picker
from tests.placer.pick.churn import decide_alike, random_sample
from tests.placer.pick.helpers import MODEL, NOW, node, query, snapshot_of

RESIDENT = {"models": {MODEL: "resident"}}


def _picker(seed: int, incremental: bool = True) -> Picker:
    return Picker(ClassWeights.defaults(), rng=np.random.default_rng(seed), incremental=incremental)


@pytest.mark.parametrize("writes_per_pick", [0, 1, 3])
def test_incremental_decisions_equal_rescoring_every_row(writes_per_pick: int) -> None:
    incremental, fresh = _picker(seed=1), _picker(seed=1, incremental=False)
    assert decide_alike(incremental, fresh, np.random.default_rng(7 + writes_per_pick), writes_per_pick) > 100
    assert incremental.rows_rescored > 0
    assert incremental.full_rescores < fresh.full_rescores


def test_a_reader_behind_the_trimmed_log_rescores_every_row() -> None:
    snapshot = snapshot_of({"id": "a", **RESIDENT}, {"id": "b", **RESIDENT})
    picker = _picker(seed=0)
    assert picker.pick(snapshot, query()) is not None
    sample = random_sample(np.random.default_rng(0))
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
