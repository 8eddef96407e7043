"""The Picker end to end over small snapshots: filters, weighting, last resort, ties, prefix memory."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from services.common.workload import WorkloadClass
from services.placer.pick import ClassWeights, Picker, PickResult, nvml_bits
from services.placer.pick.weights import DEFAULT_WEIGHTS
from tests.placer.pick.helpers import node, query, snapshot_of

CHAT, AGENT, BATCH = WorkloadClass.REALTIME_CHAT, WorkloadClass.AGENT_TOOL, WorkloadClass.BATCH
EMBEDDING, UNSPECIFIED = WorkloadClass.EMBEDDING, WorkloadClass.UNSPECIFIED
RESIDENT = {"models": {"llama-8b": "resident"}}


def make_picker(seed: int = 0, **kwargs: Any) -> Picker:
    return Picker(ClassWeights.defaults(), rng=np.random.default_rng(seed), **kwargs)


def pick(
    picker: Picker, nodes: list[dict[str, Any]], workload_class: WorkloadClass = CHAT, **fields: Any
) -> PickResult:
    result = picker.pick(snapshot_of(*nodes), query(workload_class, **fields))
    assert result is not None
    return result


# A cool GPU that is a poor choice otherwise: model cold, slots and KV nearly full.
COOL_BUT_BUSY = {"id": "cool", "temp": 50, "running": 64, "waiting": 64, "kv": 0.9}
# Variants of an idle GPU with the model resident, each degraded by heat or power (all pass the filters),
# and where a batch request goes: batch is the heat, so a GPU already in thermal slowdown gets none of it
# even over a busy, cold-model node; power capping and nearness to slowdown still let it take batch.
DEGRADED = [
    ("sw thermal slowdown", {"temp": 80, "reasons": nvml_bits.SW_THERMAL_SLOWDOWN}, "cool"),
    ("hw thermal slowdown below threshold", {"temp": 84, "reasons": nvml_bits.HW_THERMAL_SLOWDOWN}, "cool"),
    ("power capped", {"temp": 70, "reasons": nvml_bits.SW_POWER_CAP}, "warm"),
    ("within 3 C of slowdown", {"temp": 87.5, "slowdown": 90, "shutdown": 100}, "warm"),
    ("within 3 C of the default 87 C", {"temp": 85, "slowdown": 0, "shutdown": 0}, "warm"),
]


@pytest.mark.parametrize(("case", "heat", "batch_winner"), DEGRADED, ids=[case for case, _, _ in DEGRADED])
@pytest.mark.parametrize("workload_class", [CHAT, AGENT, EMBEDDING, UNSPECIFIED, BATCH])
def test_degraded_gpu_avoided_by_latency_classes_and_by_batch_when_throttling(
    case: str, heat: dict[str, Any], batch_winner: str, workload_class: WorkloadClass
) -> None:
    warm = {"id": "warm", **RESIDENT, **heat}
    result = pick(make_picker(), [COOL_BUT_BUSY, warm], workload_class)
    assert result.node_id == (batch_winner if workload_class == BATCH else "cool")
    assert not result.last_resort
    assert result.considered == 2


def test_hot_gpu_outside_the_band_is_not_demoted() -> None:
    warm = {"id": "warm", **RESIDENT, "temp": 80, "slowdown": 90}
    assert pick(make_picker(), [COOL_BUT_BUSY, warm]).node_id == "warm"


@pytest.mark.parametrize(("case", "heat", "_"), DEGRADED, ids=[case for case, _, _ in DEGRADED])
def test_degraded_gpu_is_the_last_resort_not_filtered(case: str, heat: dict[str, Any], _: str) -> None:
    nodes = [{**COOL_BUT_BUSY, "draining": True}, {"id": "warm", **RESIDENT, **heat}]
    result = pick(make_picker(), nodes, CHAT)
    assert (result.node_id, result.considered, result.last_resort) == ("warm", 1, True)
    assert result.total < 0  # demoted below every healthy total


def test_degraded_runners_up_show_their_penalty() -> None:
    hot = [
        {"id": f"hot{i}", **RESIDENT, "temp": 80, "reasons": nvml_bits.SW_THERMAL_SLOWDOWN} for i in range(5)
    ]
    result = pick(make_picker(), [COOL_BUT_BUSY, *hot], CHAT, explain_top=2)
    assert result.node_id == "cool"
    assert [c.node_id.startswith("hot") for c in result.candidates] == [False, True, True]
    assert all(c.total < 0 < result.total for c in result.candidates[1:])


def test_same_zone_preferred_when_loads_are_equal() -> None:
    nodes = [
        {"id": f"{zone}-{i}", **RESIDENT, "zone": zone, "rack": f"{zone}-r{i}", "running": 8}
        for zone in ("us-east", "us-west")
        for i in range(3)
    ]
    picker = make_picker()
    chosen = {pick(picker, nodes, caller_zone="us-west", caller_rack="elsewhere").node_id for _ in range(30)}
    assert chosen == {"us-west-0", "us-west-1", "us-west-2"}
    assert pick(picker, nodes, caller_zone="us-west", caller_rack="us-west-r1").node_id == "us-west-1"


@pytest.mark.parametrize(("count", "explain_top"), [(3, 3), (10, 1), (10, 0)])
def test_ties_broken_at_random(count: int, explain_top: int) -> None:
    names = [f"n{i}" for i in range(count)]
    nodes = [{"id": name, **RESIDENT} for name in names]
    picker = make_picker(seed=3)
    counts = Counter(pick(picker, nodes, explain_top=explain_top).node_id for _ in range(100 * count))
    assert set(counts) == set(names)
    assert min(counts.values()) > 50


def test_seeded_rng_replays_the_same_choices() -> None:
    nodes = [{"id": name, **RESIDENT} for name in ("a", "b", "c")]
    first, second = make_picker(seed=11), make_picker(seed=11)
    assert [pick(first, nodes).node_id for _ in range(20)] == [pick(second, nodes).node_id for _ in range(20)]


def test_same_prefix_goes_to_the_same_node() -> None:
    nodes = [{"id": name, **RESIDENT} for name in ("a", "b", "c", "d")]
    picker = make_picker()
    first = pick(picker, nodes, prefix_chain=(42,))
    assert first.candidates[0].scores["prefix_affinity"] == 0.0
    again = [pick(picker, nodes, prefix_chain=(42,)) for _ in range(20)]
    assert {result.node_id for result in again} == {first.node_id}
    assert again[0].candidates[0].scores["prefix_affinity"] == 1.0


def test_a_prompt_goes_where_its_longest_remembered_prefix_went() -> None:
    """Two sessions share their tenant's tools (1) and then differ (2, 3): each later turn goes to the
    node its own session was sent, not to wherever the tenant's last request went; a new session, which
    shares only the tools, follows them."""
    snapshot = snapshot_of(*({"id": name, **RESIDENT} for name in ("a", "b", "c")))
    picker = make_picker()
    first = picker.pick(snapshot, query(AGENT, prefix_chain=(1, 2)))
    assert first is not None
    second = picker.pick(snapshot, query(AGENT, prefix_chain=(1, 3), exclude=frozenset({first.node_id})))
    assert second is not None and second.node_id != first.node_id
    for chain, node_id in [((1, 2, 4), first.node_id), ((1, 3, 5), second.node_id), ((1, 6), second.node_id)]:
        result = picker.pick(snapshot, query(AGENT, prefix_chain=chain))
        assert result is not None and result.node_id == node_id, chain
        assert result.candidates[0].scores["prefix_affinity"] == 1.0
    # Once its node is gone, a session's turn falls back to the node its tools went to last.
    snapshot.remove(first.node_id)
    fallback = picker.pick(snapshot, query(AGENT, prefix_chain=(1, 2, 4, 7)))
    assert fallback is not None and fallback.node_id == second.node_id
    assert fallback.candidates[0].scores["prefix_affinity"] == 1.0


def test_prefix_memory_is_bounded_lru() -> None:
    nodes = [{"id": name, **RESIDENT} for name in ("a", "b")]
    picker = make_picker(prefix_capacity=2)
    for prefix in (1, 2, 1, 3):  # 1 was used again after 2, so 2 is the one forgotten
        pick(picker, nodes, prefix_chain=(prefix,))
    remembered = {
        h: pick(picker, nodes, prefix_chain=(h,)).candidates[0].scores["prefix_affinity"] for h in (1, 3)
    }
    assert remembered == {1: 1.0, 3: 1.0}
    forgotten = pick(picker, nodes, prefix_chain=(2,))
    assert all(candidate.scores["prefix_affinity"] == 0.0 for candidate in forgotten.candidates)


def test_prefix_memory_counts_every_element_of_a_chain() -> None:
    nodes = [{"id": name, **RESIDENT} for name in ("a", "b")]
    picker = make_picker(prefix_capacity=3)
    pick(picker, nodes, prefix_chain=(1, 2, 3))
    pick(picker, nodes, prefix_chain=(4,))  # four hashes: the chain's first, the oldest, is forgotten
    scores = {
        chain: pick(picker, nodes, prefix_chain=chain).candidates[0].scores["prefix_affinity"]
        for chain in [(1,), (1, 2)]
    }
    assert scores == {(1,): 0.0, (1, 2): 1.0}


def test_prefix_memory_survives_row_recycling() -> None:
    picker = make_picker()
    snapshot = snapshot_of({"id": "a", **RESIDENT})
    assert picker.pick(snapshot, query(prefix_chain=(7,))).node_id == "a"
    snapshot.remove("a")
    assert snapshot.upsert(node("c", **RESIDENT)) == 0  # c now sits in a's old row
    snapshot.upsert(node("b", **RESIDENT))
    result = picker.pick(snapshot, query(prefix_chain=(7,)))
    assert result is not None
    assert all(candidate.scores["prefix_affinity"] == 0.0 for candidate in result.candidates)


def test_excluded_nodes_are_never_picked() -> None:
    nodes = [
        {"id": "best", **RESIDENT},
        {"id": "worse", **RESIDENT, "running": 30},
        {"id": "also", "running": 60},  # busier and would load the model cold: last of the three
    ]
    picker = make_picker()
    chosen = {pick(picker, nodes, exclude=frozenset({"best"})).node_id for _ in range(20)}
    assert chosen == {"worse"}
    assert picker.pick(snapshot_of(*nodes), query(exclude=frozenset({"best", "worse", "also"}))) is None


def test_node_past_its_deadline_is_never_picked() -> None:
    nodes = [{"id": "expired", **RESIDENT, "deadline": -1.0}, {"id": "alive", "running": 60, "kv": 0.5}]
    picker = make_picker()
    assert {pick(picker, nodes).node_id for _ in range(20)} == {"alive"}


@pytest.mark.parametrize(
    ("case", "nodes", "fields"),
    [
        ("empty snapshot", [], {}),
        ("all draining", [{"id": "a", **RESIDENT, "draining": True}], {}),
        ("all kv full", [{"id": "a", **RESIDENT, "kv": 0.99}], {}),
        ("unknown model", [{"id": "a", **RESIDENT}], {"model": "nobody-has-it"}),
        ("no room to load", [{"id": "a", "free_gb": 1}], {}),
    ],
)
def test_no_candidate_gives_none(case: str, nodes: list[dict[str, Any]], fields: dict[str, Any]) -> None:
    assert make_picker().pick(snapshot_of(*nodes), query(**fields)) is None


def test_result_explains_the_choice() -> None:
    nodes = [{"id": f"n{i}", **RESIDENT, "running": 8 * i, "temp": 60} for i in range(6)]
    result = pick(make_picker(), nodes, CHAT, explain_top=2)
    assert (result.node_id, result.address, result.considered) == ("n0", "n0:50051", 6)
    assert [candidate.node_id for candidate in result.candidates] == ["n0", "n1", "n2"]
    node_id, total, scores = result.candidates[0]
    assert (node_id, total) == ("n0", result.total)
    weights = ClassWeights.defaults().for_class(CHAT)
    assert set(scores) == set(weights)
    assert total == pytest.approx(sum(weights[name] * value for name, value in scores.items()))
    assert result.rank_us >= 0 and result.choose_us >= 0
    assert len(pick(make_picker(), nodes, explain_top=0).candidates) == 1
    assert len(pick(make_picker(), nodes, explain_top=50).candidates) == 6


def test_framework_clamps_and_skips_zero_weights() -> None:
    raw = {"a": float("nan"), "b": 5.0, "c": -2.0}

    def odd(snapshot: Any, query: Any, rows: Any) -> np.ndarray:
        return np.array([raw[node_id] for node_id in snapshot.node_ids])[rows]

    def broken(snapshot: Any, query: Any, rows: Any) -> np.ndarray:
        raise AssertionError("a scorer with weight 0 must not run")

    weights = ClassWeights({CHAT: {"odd": 1.0, "broken": 0.0}})
    picker = Picker(weights, scorers={"odd": odd, "broken": broken}, rng=np.random.default_rng(0))
    result = pick(picker, [{"id": name, **RESIDENT} for name in raw])
    assert result.node_id == "b"
    assert {c.node_id: c.scores["odd"] for c in result.candidates} == {"b": 1.0, "a": 0.0, "c": 0.0}


def test_weights_from_config() -> None:
    weights = ClassWeights.from_config({"batch": {"thermal_headroom": 0.0, "load": 0.5}})
    assert weights.for_class(BATCH)["load"] == 0.5
    assert weights.for_class(BATCH)["thermal_headroom"] == 0.0
    # untouched defaults stay
    assert weights.for_class(BATCH)["model_affinity"] == DEFAULT_WEIGHTS[BATCH]["model_affinity"] > 0
    assert weights.for_class(CHAT) == ClassWeights.defaults().for_class(CHAT)
    assert ClassWeights.from_config(None) == ClassWeights.defaults()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"BATCH": {"thermals": 0.1}}, "'thermals'"),
        ({"BATCH": {"load": -0.1}}, "'load'"),
        ({"BATCH": {"load": float("nan")}}, "'load'"),
        ({"BATCH": {"load": "high"}}, "'load'"),
        ({"BULK": {"load": 0.1}}, "'BULK'"),
    ],
)
def test_bad_weights_are_refused_by_name(overrides: dict[str, dict[str, Any]], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ClassWeights.from_config(overrides)


def test_picker_refuses_weights_for_a_scorer_it_lacks() -> None:
    with pytest.raises(ValueError, match="'load'"):
        Picker(ClassWeights({CHAT: {"load": 1.0}}), scorers={})


def test_default_weights_by_class() -> None:
    defaults = ClassWeights.defaults()
    chat = defaults.for_class(CHAT)
    assert chat["thermal_headroom"] == chat["load"] == max(chat.values())
    assert defaults.for_class(UNSPECIFIED) == defaults.for_class(AGENT)
    assert "prefix_affinity" not in defaults.for_class(EMBEDDING)
    # Batch is the heat (prompt work at the power cap), so it is placed by thermal headroom first.
    assert max(defaults.for_class(BATCH), key=defaults.for_class(BATCH).get) == "thermal_headroom"
    for workload_class in WorkloadClass:
        assert sum(defaults.for_class(workload_class).values()) == pytest.approx(1.0)
