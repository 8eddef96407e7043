"""ClusterSnapshot.membership changes exactly when a node id gets or loses a row, so a reader keeping rows
by node id (the simulator's llm-d prefix index) knows when to look them up again."""

from __future__ import annotations

from tests.placer.pick.helpers import node, snapshot_of


def test_membership_counts_rows_given_and_taken_not_writes() -> None:
    snapshot = snapshot_of({"id": "a"}, {"id": "b"})
    start = snapshot.membership
    snapshot.upsert(node("a", running=3))  # a known node's heartbeat: the same row
    snapshot.add_waiting(snapshot.row_of["b"])
    assert snapshot.membership == start
    row = snapshot.row_of["a"]
    snapshot.remove("a")
    snapshot.remove("a")  # unknown by now: nothing happens
    assert snapshot.membership == start + 1
    snapshot.upsert(node("c"))  # takes a's row
    assert snapshot.row_of["c"] == row and snapshot.membership == start + 2
