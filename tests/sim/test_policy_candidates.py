"""The baselines' candidates (sim/policies.py's _Candidates: a filters-only RowTable refreshed from the
rows written since the last pick) are exactly filters.passing's rows, pick after pick, through a fleet
that churns as the placer's snapshot does (heartbeats, samples, recorded picks, nodes leaving, joining,
deadlines passing), for the models it knows and one it does not."""

from __future__ import annotations

import numpy as np
import pytest

from services.placer.cluster.state import ClusterState
from services.placer.pick import filters
from sim.policies import _BASE_FILTERS, _Candidates
from tests.placer.pick.churn import CLASSES, random_spec, random_write
from tests.placer.pick.helpers import MODEL, NOW, query, snapshot_of


@pytest.mark.parametrize("writes_per_pick", [0, 1, 3])
def test_candidates_are_the_rows_passing_the_filters(writes_per_pick: int) -> None:
    rng = np.random.default_rng(7 + writes_per_pick)
    ids = [f"n{i}" for i in range(12)]
    state = ClusterState(clock=lambda: NOW)
    state.snapshot = snapshot_of(*({"id": i, **random_spec(rng, k)} for k, i in enumerate(ids)))
    candidates = _Candidates()
    nonempty = 0
    for step in range(300):
        for w in range(writes_per_pick):
            random_write(state.snapshot, rng, step * writes_per_pick + w, ids)
        model = [MODEL, "qwen-7b", "never-reported"][step % 7 % 3]
        q = query(CLASSES[step % 3], model=model, now_s=NOW + step / 15)
        expected = filters.passing(state.snapshot, q, _BASE_FILTERS)
        np.testing.assert_array_equal(candidates(state, q), expected, err_msg=f"step {step}")
        nonempty += bool(expected.size)
    assert nonempty > 100  # the comparison saw candidates, not only empty fleets
