"""What a pick needs to know about every row for one model and workload class, kept current row by row.

A pick is a function of the rows' columns, the model, the class and the request. Everything but the
request (the filters' verdict, the row scorers' values, the degraded penalty) changes only where the
snapshot is written, and the snapshot logs which rows it wrote. So a RowTable rescores just those rows
on the next pick: at 8,000 workers, a few rows per pick instead of every column of the fleet, which is
what keeps a pick's cost flat while heartbeats and telemetry arrive thousands of times a second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick.filters import Filter, Rows, all_rows, verdict
from services.placer.pick.native_rows import NativeRows
from services.placer.pick.query import PickQuery
from services.placer.pick.scorers import RowScorer, clamp_scores

# Rescoring more than this share of the rows one by one costs more than rescoring all of them at once.
_FULL_RESCORE_SHARE = 0.25

Degraded = Callable[[ClusterSnapshot, Rows], np.ndarray]


class RowTable:
    """Per row, for one model and class: passed (every filter and live), the clamped row-scorer values,
    degraded, and base = their weighted sum less the degraded penalty, -inf where not passed.

    A pick adds its request scorers onto base and takes the best; refresh() first brings the rows written
    since the last refresh up to date, and rows whose heartbeat deadline has passed since."""

    def __init__(
        self,
        filters: Sequence[Filter],
        scorers: Sequence[RowScorer],
        weights: Sequence[float],
        degraded: Degraded | None,
        degraded_penalty: float,
        native: NativeRows | None = None,
    ) -> None:
        """degraded: per row, whether the node is a last resort (None: the class never avoids one);
        degraded_penalty is subtracted from a degraded row's total, more than any total can be, so a
        degraded node wins only when every candidate is degraded. native: the same filters, scorers and
        degraded test compiled (native_rows.py), which then does the rescoring."""
        self._filters = tuple(filters)
        self._scorers = tuple(scorers)
        self._weights = tuple(float(w) for w in weights)  # [S]
        self._degraded_of = degraded
        self._penalty = degraded_penalty
        self.native = native
        self._snapshot: ClusterSnapshot | None = None
        self._epoch = -1
        self._position = 0  # the snapshot's write_position when last refreshed
        self._latest_now_s = float("-inf")  # time only moves forward between full rescores
        self.valid_until_s = float("inf")  # no passed row's deadline is earlier (a lower bound)
        self.count = 0  # rows passed
        self.passed = np.zeros(0, dtype=bool)
        self.degraded = np.zeros(0, dtype=bool)
        self.base = np.zeros(0)
        self.scores = np.zeros((len(self._scorers), 0))  # [S, capacity]

    def refresh(self, snapshot: ClusterSnapshot, query: PickQuery, incremental: bool = True) -> int:
        """Bring every row up to date for query's model, class and time; the rows rescored."""
        now = query.now_s
        written = None
        same = snapshot is self._snapshot and snapshot.epoch == self._epoch
        # A clock stepping back could revive rows that expired: then every row is rescored.
        if incremental and same and now >= self._latest_now_s:
            written = snapshot.written_since(self._position)
        self._position = snapshot.write_position
        self._latest_now_s = max(self._latest_now_s, now) if written is not None else now
        if written is None or len(written) > _FULL_RESCORE_SHARE * snapshot.num_rows:
            self._rescore_all(snapshot, query)
            return snapshot.num_rows
        rescored = 0
        if written:
            # C takes repeats as they come; numpy's fancy indexing needs each row once.
            rows = written if self.native else np.unique(np.array(written, dtype=np.intp))
            self._rescore(snapshot, query, rows)
            rescored = len(rows)
        if now >= self.valid_until_s:
            n = snapshot.num_rows
            expired = np.flatnonzero(self.passed[:n] & (snapshot.deadline_s[:n] <= now))
            self._rescore(snapshot, query, expired)
            passed = self.passed[:n]
            self.valid_until_s = float(snapshot.deadline_s[:n][passed].min()) if passed.any() else np.inf
            rescored += expired.size
        return rescored

    def _rescore_all(self, snapshot: ClusterSnapshot, query: PickQuery) -> None:
        if self._snapshot is not snapshot or self.passed.size != snapshot.capacity:
            capacity = snapshot.capacity
            self.passed = np.zeros(capacity, dtype=bool)
            self.degraded = np.zeros(capacity, dtype=bool)
            self.base = np.full(capacity, -np.inf)
            self.scores = np.zeros((len(self._scorers), capacity))
        if self.native is not None:
            self.native.bind(snapshot, self.passed, self.degraded, self.base, self.scores)
        self._snapshot = snapshot
        self._epoch = snapshot.epoch
        self.passed[:] = False
        self.count = 0
        self.valid_until_s = float("inf")
        self._rescore(snapshot, query, all_rows(snapshot))

    def _rescore(self, snapshot: ClusterSnapshot, query: PickQuery, rows: Rows | list[int]) -> None:
        """Rows (a slice, or unique row indices; repeats allowed when native) rescored for query's model
        and class at query.now_s."""
        if self.native is not None:
            indices = None if isinstance(rows, slice) else rows
            delta, self.valid_until_s = self.native.rescore(
                indices, snapshot.num_rows, query.now_s, self.valid_until_s
            )
            self.count += delta
            return
        assert not isinstance(rows, list)
        ok = verdict(snapshot, query, self._filters, rows)
        values = np.empty((len(self._scorers), ok.size))
        for i, scorer in enumerate(self._scorers):
            values[i] = scorer(snapshot, query, rows)
        clamp_scores(values)
        # Summed scorer by scorer, not as a matrix product, so a row's total rounds the same whether
        # it is rescored alone or with the whole fleet.
        total = np.zeros(ok.size)
        for weight, value in zip(self._weights, values, strict=True):
            total += weight * value
        if self._degraded_of is not None:
            degraded = self._degraded_of(snapshot, rows)
            total -= self._penalty * degraded
            self.degraded[rows] = degraded
        passed = int(np.count_nonzero(ok))
        self.count += passed - int(np.count_nonzero(self.passed[rows]))
        self.passed[rows] = ok
        self.base[rows] = np.where(ok, total, -np.inf)
        self.scores[:, rows] = values
        if passed:
            self.valid_until_s = min(self.valid_until_s, float(snapshot.deadline_s[rows][ok].min()))
