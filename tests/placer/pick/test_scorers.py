"""Each pick scorer against a table of one-node cases: the value it gives that node."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from services.common.workload import WorkloadClass
from services.placer.pick import nvml_bits, scorers
from services.placer.pick.query import NO_CONTEXT, PickContext
from tests.placer.pick.helpers import by_id, query, snapshot_of

# (case, node spec, query fields, value)
AFFINITY = [
    ("resident", {"models": {"llama-8b": "resident"}}, {}, 1.0),
    ("host copy", {"models": {"llama-8b": "host"}}, {}, 0.5),
    ("cold", {"models": {"llama-8b": "cold"}}, {}, 0.0),
    ("another model resident", {"models": {"llama-8b": "cold", "qwen-7b": "resident"}}, {}, 0.0),
    ("unknown model", {}, {"model": "nobody-has-it"}, 0.0),
]

LOAD = [  # max_running 64 unless given
    ("idle", {}, {}, 1.0),
    ("half the slots running", {"running": 32}, {}, 0.75),
    ("running, waiting and kv", {"running": 32, "waiting": 32, "kv": 0.5}, {}, 0.25),
    ("kv full, nothing queued", {"kv": 1.0}, {}, 0.5),
    ("queue far past capacity", {"running": 64, "waiting": 192}, {}, 0.0),
    ("capacity 0 counts as 1", {"max_running": 0, "running": 1}, {}, 0.5),
]

ISOLATION = [  # a chat request; max_running 64
    ("idle", {}, {}, 1.0),
    ("no batch", {"running": 10}, {}, 1.0),
    ("a quarter of the work is batch", {"running": 6, "waiting": 2, "batch_running": 2}, {}, 0.75),
    ("batch queued counts", {"running": 4, "waiting": 4, "batch_waiting": 4}, {}, 0.5),
    ("only batch", {"running": 8, "batch_running": 8}, {}, 0.0),
]
BATCH_ISOLATION = [  # a batch request; max_running 64, room ends at kv 0.95
    ("idle", {}, 0.0),
    ("only latency work", {"running": 10}, 0.0),
    ("half batch, room left", {"running": 8, "batch_running": 4}, 0.5),
    ("only batch, room left", {"running": 8, "batch_running": 8, "kv": 0.9}, 1.0),
    ("batch waiting there", {"running": 8, "waiting": 1, "batch_running": 8, "batch_waiting": 1}, 0.0),
    ("every seat taken", {"running": 64, "batch_running": 64}, 0.0),
    ("kv at the limit", {"running": 8, "batch_running": 8, "kv": 0.95}, 0.0),
]

POWER_CAP = nvml_bits.SW_POWER_CAP
THERMAL = [  # slowdown 90 C unless given; span 30 C, horizon 10 s
    ("no thermal sample: neutral", {}, {}, 0.5),
    ("cool: full headroom", {"temp": 50}, {}, 1.0),
    ("halfway", {"temp": 75}, {}, 0.5),
    ("at slowdown", {"temp": 90}, {}, 0.0),
    ("past slowdown", {"temp": 93, "shutdown": 100}, {}, 0.0),
    ("slowdown unknown: 87 C assumed", {"temp": 72, "slowdown": 0}, {}, 0.5),
    ("rising 0.6 C/s", {"temp": 75, "trend": 0.6}, {}, 0.3),
    ("falling counts as steady", {"temp": 75, "trend": -1.0}, {}, 0.5),
    ("power capped", {"temp": 75, "reasons": POWER_CAP}, {}, 0.125),
    ("power brake", {"temp": 40, "reasons": nvml_bits.HW_POWER_BRAKE_SLOWDOWN}, {}, 0.25),
    ("sw thermal slowdown", {"temp": 60, "reasons": nvml_bits.SW_THERMAL_SLOWDOWN}, {}, 0.0),
    ("hw slowdown", {"temp": 60, "reasons": nvml_bits.HW_SLOWDOWN}, {}, 0.0),
    ("thermal and power", {"temp": 60, "reasons": POWER_CAP | nvml_bits.HW_THERMAL_SLOWDOWN}, {}, 0.0),
    ("idle bit is harmless", {"temp": 60, "reasons": nvml_bits.GPU_IDLE}, {}, 1.0),
]

PLACED = {"zone": "z1", "rack": "r1", "host": "h1"}
TOPOLOGY = [
    ("caller unknown", PLACED, {}, 0.0),
    ("same host", PLACED, {"caller_zone": "z1", "caller_rack": "r1", "caller_host": "h1"}, 1.0),
    ("same rack", PLACED, {"caller_zone": "z1", "caller_rack": "r1", "caller_host": "h2"}, 0.7),
    ("same zone", PLACED, {"caller_zone": "z1", "caller_rack": "r2", "caller_host": "h2"}, 0.4),
    ("other zone", PLACED, {"caller_zone": "z2", "caller_rack": "r2", "caller_host": "h2"}, 0.0),
    ("only the host label known", PLACED, {"caller_host": "h1"}, 1.0),
    ("node unlabelled, caller labelled", {}, {"caller_zone": "z1", "caller_host": "h1"}, 0.0),
    ("both unlabelled: unknown never matches", {}, {}, 0.0),
]

PREFIX = [  # the node sits in row 0
    ("no prefix remembered", {}, NO_CONTEXT, 0.0),
    ("this node served it", {}, PickContext(prefix_row=0), 1.0),
    ("it served it, 8 waiting (a latency class)", {"waiting": 8}, PickContext(prefix_row=0), 1.0),
    ("another node served it", {}, PickContext(prefix_row=1), 0.0),
]
BATCH_PREFIX = [  # a batch request's prefix affinity fades with the queue on that node (limit 8)
    ("it served it, idle", {}, PickContext(prefix_row=0), 1.0),
    ("it served it, 4 waiting", {"waiting": 4}, PickContext(prefix_row=0), 0.5),
    ("it served it, 8 waiting", {"waiting": 8}, PickContext(prefix_row=0), 0.0),
]


def _value(
    scorer: scorers.Scorer, spec: dict[str, Any], fields: dict[str, Any], context: PickContext
) -> float:
    snapshot = snapshot_of({"id": "n", **spec})
    values = scorers.evaluate(scorer, snapshot, query(**fields), context)
    assert values.shape == (snapshot.num_rows,)
    return by_id(snapshot, values)["n"]


def _params(name: str, cases: list[tuple[str, dict[str, Any], dict[str, Any], float]]) -> list[Any]:
    scorer = scorers.DEFAULT_SCORERS[name]
    return [pytest.param(scorer, s, f, NO_CONTEXT, v, id=f"{name}: {c}") for c, s, f, v in cases]


def _batch_params(name: str, cases: list[tuple[str, dict[str, Any], PickContext, float]]) -> list[Any]:
    """Cases of a BATCH request: (case, node spec, context, value)."""
    scorer, batch = scorers.DEFAULT_SCORERS[name], {"workload_class": WorkloadClass.BATCH}
    return [pytest.param(scorer, s, batch, ctx, v, id=f"{name}, batch: {c}") for c, s, ctx, v in cases]


@pytest.mark.parametrize(
    ("scorer", "spec", "fields", "context", "expected"),
    _params("model_affinity", AFFINITY)
    + _params("load", LOAD)
    + _params("thermal_headroom", THERMAL)
    + _params("batch_isolation", ISOLATION)
    + _batch_params("batch_isolation", [(c, s, NO_CONTEXT, v) for c, s, v in BATCH_ISOLATION])
    + _params("topology", TOPOLOGY)
    + [
        pytest.param(scorers.DEFAULT_SCORERS["prefix_affinity"], s, {}, ctx, v, id=f"prefix_affinity: {c}")
        for c, s, ctx, v in PREFIX
    ]
    + _batch_params("prefix_affinity", BATCH_PREFIX),
)
def test_scorer_cases(
    scorer: scorers.Scorer,
    spec: dict[str, Any],
    fields: dict[str, Any],
    context: PickContext,
    expected: float,
) -> None:
    assert _value(scorer, spec, fields, context) == pytest.approx(expected)


def test_scorers_give_a_number_per_row_and_change_nothing() -> None:
    rng = np.random.default_rng(7)
    nodes = [
        {
            "id": f"n{i}",
            "models": {"llama-8b": ["resident", "host", "cold"][i % 3]},
            "running": int(rng.integers(0, 200)),
            "waiting": int(rng.integers(0, 200)),
            "kv": float(rng.random()),
            "temp": float(rng.uniform(20, 110)),
            "slowdown": float(rng.choice([0.0, 88.0])),
            "trend": float(rng.normal(0, 2)),
            "reasons": int(rng.integers(0, 0x200)),
            "batch_running": int(rng.integers(0, 3)),
            "zone": f"z{i % 2}",
        }
        for i in range(50)
    ]
    snapshot = snapshot_of(*nodes)
    before = {name: snapshot.column(name).copy() for name in ("temperature_c", "running", "kv_usage")}
    q = query(caller_zone="z1", caller_host="n3")
    for name, scorer in scorers.DEFAULT_SCORERS.items():
        if isinstance(scorer, scorers.RequestScorer):
            out = np.zeros(snapshot.num_rows)
            written = scorer.score(snapshot, q, PickContext(prefix_row=4), out)
            assert written is not None and np.all(out[np.setdiff1d(np.arange(out.size), written)] == 0), name
        else:
            out = scorer(snapshot, q, slice(0, snapshot.num_rows))
            assert out.shape == (snapshot.num_rows,), name
            rows = np.array([3, 1, 4])
            np.testing.assert_array_equal(scorer(snapshot, q, rows), out[rows])  # rows or a slice alike
        assert np.all(np.isfinite(out)), name
    for name, column in before.items():
        np.testing.assert_array_equal(snapshot.column(name), column)


def test_every_scorer_documents_its_formula() -> None:
    for name, scorer in scorers.DEFAULT_SCORERS.items():
        function = scorer.score if isinstance(scorer, scorers.RequestScorer) else scorer
        function = function.func if isinstance(function, functools.partial) else function
        assert function.__doc__ and len(function.__doc__) > 40, name


def test_thermal_constants_come_from_config() -> None:
    config = scorers.ScorerConfig(thermal_span_c=10.0, default_slowdown_c=80.0, no_sample_thermal_score=0.2)
    thermal = scorers.build_scorers(config)["thermal_headroom"]
    snapshot = snapshot_of({"id": "hot", "temp": 75, "slowdown": 0}, {"id": "unknown"})
    assert by_id(snapshot, scorers.evaluate(thermal, snapshot, query(), NO_CONTEXT)) == pytest.approx(
        {"hot": 0.5, "unknown": 0.2}
    )


def test_one_value_is_clamped_as_an_array_is() -> None:
    """clamp_score (a point scorer's value) against clamp_scores: NaN and negatives to 0, above 1 to 1."""
    values = [float("nan"), -0.5, -0.0, 0.0, 0.3, 1.0, 1.7, float("inf"), float("-inf")]
    expected = scorers.clamp_scores(np.array(values)).tolist()
    assert [scorers.clamp_score(v) for v in values] == expected
    assert [scorers.clamp_score(np.float64(v)) for v in values] == expected
