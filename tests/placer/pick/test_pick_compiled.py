"""The compiled pick (native.py, csrc/pick_rows.c) decides exactly as the numpy reference: the same
node, totals, explanations and random tie-breaks through a churning fleet, for the default weights and
for configs that turn every standard scorer on; it serves only the standard filters and scorers, and
where it cannot be built the Picker stays in numpy and says why."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest

from services.common.workload import WorkloadClass
from services.placer.pick import ClassWeights, Picker, native
from services.placer.pick.filters import FilterConfig, build_filters
from services.placer.pick.scorers import RequestScorer, ScorerConfig, build_scorers
from tests.placer.pick.churn import decide_alike
from tests.placer.pick.helpers import MODEL, node, query, snapshot_of

needs_compiler = pytest.mark.skipif(native.library() is None, reason="no C compiler: numpy only")
ALL_ON = {name: 0.2 for name in build_scorers()}  # every standard scorer weighed, batch_isolation too
WEIGHTS = {
    "defaults": None,
    "every scorer": {wc.name: ALL_ON for wc in WorkloadClass},
}
CONFIGS = {
    "default configs": (FilterConfig(), ScorerConfig()),
    "other configs": (
        FilterConfig(kv_full_fraction=0.9, shutdown_margin_c=8.0),
        ScorerConfig(
            thermal_span_c=20.0,
            thermal_horizon_s=30.0,
            default_slowdown_c=85.0,
            no_sample_thermal_score=0.3,
            batch_kv_limit=0.8,
            node_reserve_fraction=0.4,
        ),
    ),
}


def _filters(config: FilterConfig, thermal_filter: bool = True) -> dict:
    """The standard filters, or (as the simulator's baselines run) all but not_thermally_critical."""
    standard = build_filters(config)
    return (
        standard if thermal_filter else {k: f for k, f in standard.items() if k != "not_thermally_critical"}
    )


def _picker(
    weights: str, config: str, compiled: bool, incremental: bool = True, thermal_filter: bool = True
) -> Picker:
    filter_config, scorer_config = CONFIGS[config]
    return Picker(
        ClassWeights.from_config(WEIGHTS[weights]),
        filters=_filters(filter_config, thermal_filter),
        scorers=build_scorers(scorer_config),
        rng=np.random.default_rng(5),
        near_slowdown_band_c=4.0,
        compiled=compiled,
        incremental=incremental,
    )


@needs_compiler
@pytest.mark.parametrize("thermal_filter", [True, False])
@pytest.mark.parametrize("writes_per_pick", [0, 1, 3])
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("weights", WEIGHTS)
def test_compiled_decisions_equal_numpy(
    weights: str, config: str, writes_per_pick: int, thermal_filter: bool
) -> None:
    compiled = _picker(weights, config, compiled=True, thermal_filter=thermal_filter)
    reference = _picker(weights, config, compiled=False, incremental=False, thermal_filter=thermal_filter)
    assert (
        decide_alike(compiled, reference, np.random.default_rng(11 + writes_per_pick), writes_per_pick) > 100
    )
    assert compiled._tables and all(t.native is not None for t in compiled._tables.values())
    assert all(t.native is None for t in reference._tables.values())


@needs_compiler
@pytest.mark.parametrize(
    ("case", "running", "explain_top"),
    [
        ("more ties than runners-up: every tie, in row order", [0] * 9, 3),
        ("exactly runners-up + 1 ties", [0, 0, 0, 0, 8, 9], 3),
        ("fewer ties: the best, equal totals in row order", [0, 0, 5, 5, 5, 5, 9], 3),
        ("no runners-up", [3, 0, 0, 1], 0),
    ],
)
def test_ties_and_runners_up_match(case: str, running: list[int], explain_top: int) -> None:
    specs = [{"id": f"n{i}", "models": {MODEL: "resident"}, "running": r} for i, r in enumerate(running)]
    compiled, reference = (
        Picker(ClassWeights.defaults(), rng=np.random.default_rng(2)),
        Picker(ClassWeights.defaults(), rng=np.random.default_rng(2), compiled=False),
    )
    snapshot = snapshot_of(*specs)
    for _ in range(20):
        a = compiled.pick(snapshot, query(explain_top=explain_top))
        b = reference.pick(snapshot, query(explain_top=explain_top))
        assert a is not None and b is not None
        assert (a.node_id, a.candidates) == (b.node_id, b.candidates), case


def _last_rows_twice(snapshot, query, context, out):  # type: ignore[no-untyped-def]
    """A request scorer of a test's own, writing rows repeatedly and out of order."""
    last = snapshot.num_rows - 1
    out[last] = 1.7  # clamped to 1
    out[0] = 0.6
    return np.array([0, last, 0])


@needs_compiler
def test_a_request_scorer_of_its_own_is_added_as_numpy_adds_it() -> None:
    scorers = {**build_scorers(), "last_rows": RequestScorer(_last_rows_twice)}
    weights = ClassWeights.from_config({wc.name: {"last_rows": 0.3} for wc in WorkloadClass}, scorers)
    compiled, reference = (
        Picker(weights, scorers=scorers, rng=np.random.default_rng(4), compiled=c) for c in (True, False)
    )
    assert decide_alike(compiled, reference, np.random.default_rng(3), writes_per_pick=1) > 100
    assert all(t.native is not None for t in compiled._tables.values())


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_a_point_scorer_decides_as_its_score_does(compiled: bool) -> None:
    """prefix_affinity's point (one row and its value, added as a scalar) against its score alone (a
    one-row array written, clamped and cleared): the same nodes, totals and explanations."""
    config = ScorerConfig(prefix_queue_limit=3.0)
    standard = build_scorers(config)
    assert standard["prefix_affinity"].point is not None  # type: ignore[union-attr]
    score_only = {**standard, "prefix_affinity": RequestScorer(standard["prefix_affinity"].score)}  # type: ignore[union-attr]
    weights = ClassWeights.from_config({wc.name: {**ALL_ON, "prefix_affinity": 2.0} for wc in WorkloadClass})
    with_point, reference = (
        Picker(weights, scorers=s, rng=np.random.default_rng(6), compiled=compiled)
        for s in (standard, score_only)
    )
    assert decide_alike(with_point, reference, np.random.default_rng(8), writes_per_pick=1) > 100
    assert with_point._points and not reference._points  # the point path ran, and only in one


def test_a_point_outside_the_snapshot_is_refused_by_name() -> None:
    """A point scorer's bug (a row past the snapshot) fails the pick naming the scorer, rather than
    writing into the buffer's spare capacity where later picks would read it."""
    stray = RequestScorer(lambda *_: None, point=lambda snapshot, query, context: (snapshot.num_rows, 1.0))
    scorers = {**build_scorers(), "stray": stray}
    weights = ClassWeights.from_config({wc.name: {"stray": 0.5} for wc in WorkloadClass}, scorers)
    picker = Picker(weights, scorers=scorers, rng=np.random.default_rng(0))
    snapshot = snapshot_of({"id": "a", "models": {MODEL: "resident"}})
    with pytest.raises(
        ValueError, match="request scorer 'stray' pointed at row 1, outside the snapshot's 1 rows"
    ):
        picker.pick(snapshot, query())


def _keep_all(snapshot, query, rows):  # type: ignore[no-untyped-def]
    """A filter and a row scorer of a test's own: every row passes, every row scores 1."""
    return np.ones(snapshot.live[rows].shape, dtype=bool)


@needs_compiler
@pytest.mark.parametrize(
    ("case", "kwargs", "compiled"),
    [
        ("standard filters and scorers", {}, True),
        ("standard with configs", {"filters": build_filters(FilterConfig(kv_full_fraction=0.5))}, True),
        (
            "standard but the thermal filter",
            {"filters": _filters(FilterConfig(), thermal_filter=False)},
            True,
        ),
        ("a filter of its own", {"filters": {**build_filters(), "odd": _keep_all}}, False),
        ("a standard filter left out", {"filters": {"healthy": build_filters()["healthy"]}}, False),
        ("a row scorer of its own", {"scorers": {**build_scorers(), "load": _keep_all}}, False),
        ("compiled=False", {"compiled": False}, False),
    ],
)
def test_only_the_standard_filters_and_scorers_are_compiled(case: str, kwargs: dict, compiled: bool) -> None:
    picker = Picker(ClassWeights.defaults(), rng=np.random.default_rng(0), **kwargs)
    snapshot = snapshot_of({"id": "a", "models": {MODEL: "resident"}}, {"id": "b", "models": {MODEL: "host"}})
    assert picker.pick(snapshot, query()) is not None
    assert [t.native is not None for t in picker._tables.values()] == [compiled], case


@pytest.fixture
def fresh_library(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[pytest.MonkeyPatch]:  # type: ignore[no-untyped-def]
    """native.library() rebuilt from nothing: an empty cache, and forgotten again afterwards."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native._library.cache_clear()
    yield monkeypatch
    native._library.cache_clear()


@pytest.mark.parametrize(
    ("case", "env", "reason"),
    [
        ("switched off", {native.ENV_SWITCH: "0"}, None),
        ("the compiler fails", {"CC": "false"}, "compiled pick unavailable"),
    ],
)
def test_without_the_library_picks_stay_in_numpy(
    fresh_library: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    case: str,
    env: dict,
    reason: str | None,
) -> None:
    for name, value in env.items():
        fresh_library.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.library() is None, case
    assert (reason in caplog.text) if reason else not caplog.text
    picker = Picker(ClassWeights.defaults(), rng=np.random.default_rng(0))
    snapshot = snapshot_of({"id": "a", "models": {MODEL: "resident"}})
    assert picker.pick(snapshot, query()).node_id == "a"  # type: ignore[union-attr]
    assert all(t.native is None for t in picker._tables.values())


@needs_compiler
def test_a_fresh_cache_builds_the_library_once(fresh_library: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert native.library() is not None
    built = list((tmp_path / "hanzo").glob("placer_pick_*.so"))
    assert len(built) == 1 and native.build() == built[0]


@needs_compiler
@pytest.mark.parametrize("compiled", [True, False])
def test_a_caller_label_that_appears_later_counts_from_then_on(compiled: bool) -> None:
    """The compiled ranking remembers a caller's label rows until the snapshot's labels move: a zone
    no node carried at the first pick wins topology once a node joins it."""
    picker = Picker(ClassWeights.defaults(), rng=np.random.default_rng(3), compiled=compiled)
    snapshot = snapshot_of(
        {"id": "far", "models": {MODEL: "resident"}, "zone": "z1", "rack": "r1", "host": "h1"},
    )
    caller = query(caller_zone="z2", caller_rack="r2", caller_host="h2", explain_top=0)
    first = picker.pick(snapshot, caller)
    assert first is not None and first.node_id == "far"
    assert first.candidates[0].scores["topology"] == 0.0
    snapshot.upsert(node("near", models={MODEL: "resident"}, zone="z2", rack="r2", host="h2"))
    second = picker.pick(snapshot, caller)
    assert second is not None and second.node_id == "near"
    assert second.candidates[0].scores["topology"] == 1.0


@pytest.mark.parametrize("compiled", [True, False])
def test_the_chosen_node_is_explained_alike_with_and_without_runners_up(compiled: bool) -> None:
    specs = [{"id": f"n{i}", "models": {MODEL: "resident"}, "running": r} for i, r in enumerate([4, 1, 7, 2])]
    snapshot = snapshot_of(*specs)
    alone, explained = (
        Picker(ClassWeights.defaults(), rng=np.random.default_rng(4), compiled=compiled) for _ in range(2)
    )
    for workload_class in WorkloadClass:
        asked = {"prefix_chain": (7,), "caller_zone": "z0"}
        a = alone.pick(snapshot, query(workload_class, explain_top=0, **asked))
        b = explained.pick(snapshot, query(workload_class, explain_top=3, **asked))
        assert a is not None and b is not None
        assert len(a.candidates) == 1 and a.candidates[0] == b.candidates[0], workload_class
