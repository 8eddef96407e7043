"""The prefix cost rule (services/placer/pick/prefix_cost.py) through the Picker: a latency request stays
with its cached history when recomputing it elsewhere costs more prefill than the queue it avoids."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.common.workload import WorkloadClass
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick import ClassWeights, Picker, PickResult, nvml_bits
from services.placer.pick.prefix_cost import latency_tokens_of
from tests.placer.pick.helpers import query, snapshot_of

CHAT, AGENT, BATCH = WorkloadClass.REALTIME_CHAT, WorkloadClass.AGENT_TOOL, WorkloadClass.BATCH
RESIDENT = {"models": {"llama-8b": "resident"}}
# An agent session's first call (tools 1, task 2), then its next call, which extends it: 3,900 tokens of
# the 4,000 were the first call's.
FIRST = {"prefix_chain": (1, 2), "prefix_chain_tokens": (2_000, 3_900)}
NEXT = {"prefix_chain": (1, 2, 3), "prefix_chain_tokens": (2_000, 3_900, 4_000)}


def _picker(compiled: bool, **kwargs: Any) -> Picker:
    return Picker(ClassWeights.defaults(), rng=np.random.default_rng(0), compiled=compiled, **kwargs)


def _sent_to_holder(picker: Picker, snapshot: ClusterSnapshot, workload: WorkloadClass = AGENT) -> None:
    """The first call went to "holder" (the idle node "idle" excluded), so the memo remembers it there."""
    first = picker.pick(snapshot, query(workload, exclude=frozenset({"idle"}), **FIRST))
    assert first is not None and first.node_id == "holder"


def _next_call(
    holder: dict[str, Any], compiled: bool, idle: dict[str, Any] | None = None, **fields: Any
) -> PickResult:
    """The session's next call after its first went to holder; idle: the other node's spec; fields: the
    query's."""
    snapshot = snapshot_of({"id": "holder", **RESIDENT, **holder}, {"id": "idle", **RESIDENT, **(idle or {})})
    picker = _picker(compiled)
    _sent_to_holder(picker, snapshot)
    result = picker.pick(snapshot, query(AGENT, **NEXT, **fields))
    assert result is not None
    return result


@pytest.mark.parametrize("compiled", [True, False])
def test_a_long_history_stays_where_it_is_cached_behind_a_short_queue(compiled: bool) -> None:
    # Busy enough that load alone ranks the idle node first.
    result = _next_call({"running": 24, "kv": 0.6, "latency_tokens": 500}, compiled)
    assert result.node_id == "holder" and result.prefix_kept
    assert result.cached_tokens == 3_900  # the first call's prompt: what the placer counts it will skip
    chosen, ranked_winner = result.candidates[0], result.candidates[1]
    assert ranked_winner.node_id == "idle" and ranked_winner.total > chosen.total
    assert chosen.scores["prefix_affinity"] == 1.0


def test_the_kept_node_is_explained_the_same_compiled_or_not() -> None:
    holder = {"running": 24, "kv": 0.6, "latency_tokens": 500, "zone": "z1", "rack": "r1"}
    compiled = _next_call(holder, True, caller_zone="z1")
    plain = _next_call(holder, False, caller_zone="z1")
    assert compiled.candidates == plain.candidates
    assert compiled.candidates[0].scores["topology"] == 0.4


def test_caller_labels_reach_the_kept_nodes_topology() -> None:
    snapshot = snapshot_of(
        {
            "id": "holder",
            **RESIDENT,
            "running": 24,
            "kv": 0.6,
            "latency_tokens": 500,
            "zone": "z",
            "rack": "r",
        },
        {"id": "idle", **RESIDENT, "zone": "z", "rack": "r", "host": "h"},
    )
    picker = _picker(True)
    _sent_to_holder(picker, snapshot)
    result = picker.pick(snapshot, query(AGENT, caller_zone="z", caller_rack="r", caller_host="h", **NEXT))
    assert result is not None and result.prefix_kept
    assert [c.scores["topology"] for c in result.candidates] == [0.7, 1.0]


@pytest.mark.parametrize("compiled", [True, False])
def test_a_queue_longer_than_the_saving_moves_the_request(compiled: bool) -> None:
    # 5,000 + 100 tokens to compute there against 4,000 on the idle node.
    result = _next_call({"running": 24, "kv": 0.6, "latency_tokens": 5_000}, compiled)
    assert result.node_id == "idle" and not result.prefix_kept
    assert result.cached_tokens == 0  # the memo points at the holder


def test_a_slowed_clock_counts_against_the_prefix_node() -> None:
    # (2,000 + 100) at full clock is below the idle node's 4,000; at 40% of it (5,250), above.
    cool = {"running": 24, "kv": 0.6, "latency_tokens": 2_000, "temp": 60}
    assert _next_call(cool, True, idle={"temp": 60}).prefix_kept
    assert _next_call({**cool, "clock": 0.4 * 1980}, True, idle={"temp": 60}).node_id == "idle"


def test_without_token_ends_each_element_counts_128_tokens() -> None:
    snapshot = snapshot_of(
        {"id": "holder", **RESIDENT, "running": 24, "kv": 0.6, "latency_tokens": 200},
        {"id": "idle", **RESIDENT},
    )
    picker = _picker(True)
    assert (
        picker.pick(snapshot, query(AGENT, prefix_chain=(1, 2), exclude=frozenset({"idle"}))).node_id
        == "holder"
    )
    # 2 elements cached (256 tokens) of 3: holder computes 200 + 128, idle 384.
    kept = picker.pick(snapshot, query(AGENT, prefix_chain=(1, 2, 3)))
    assert kept is not None and kept.node_id == "holder" and kept.prefix_kept
    # With 300 queued there, 428 > 384: not worth it.
    snapshot.latency_prompt_tokens[snapshot.row_of["holder"]] = 300
    moved = picker.pick(snapshot, query(AGENT, prefix_chain=(1, 2, 4)))
    assert moved is not None and moved.node_id == "idle"


@pytest.mark.parametrize(
    ("case", "holder", "kwargs", "workload"),
    [
        # Its prefix score fades with the queue there; the rule would keep it (100 tokens against 4,000).
        ("batch is left to its scorers", {"waiting": 8}, {}, BATCH),
        ("a degraded prefix node", {"temp": 80, "reasons": nvml_bits.SW_THERMAL_SLOWDOWN}, {}, AGENT),
        ("the rule turned off", {}, {"prefix_cost_classes": frozenset()}, AGENT),
        ("the model evicted since", {"models": {"llama-8b": "host"}}, {}, AGENT),
    ],
)
def test_when_the_rule_does_not_keep_the_prefix(
    case: str, holder: dict[str, Any], kwargs: dict[str, Any], workload: WorkloadClass
) -> None:
    busy = {"running": 24, "kv": 0.6, "latency_tokens": 0, **holder}
    snapshot = snapshot_of({"id": "holder", **RESIDENT, **busy}, {"id": "idle", **RESIDENT})
    picker = _picker(True, **kwargs)
    # The memo learns the holder from a pick that had no other choice.
    first = picker.pick(snapshot, query(workload, exclude=frozenset({"idle"}), **FIRST))
    assert first is not None and first.node_id == "holder", case
    result = picker.pick(snapshot, query(workload, **NEXT))
    assert result is not None and result.node_id == "idle" and not result.prefix_kept, case


@pytest.mark.parametrize("compiled", [True, False])
def test_a_prefix_node_out_of_balance_is_not_followed(compiled: bool) -> None:
    """A short queue but 40 requests against none: past SGLang's balance threshold (32 more, and more
    than 1.0001 times), so the session's call goes where the ranking sent it."""
    result = _next_call({"running": 40, "kv": 0.6, "latency_tokens": 500}, compiled)
    assert result.node_id == "idle" and not result.prefix_kept
    # 40 against 10: 30 more, within the threshold, so the prefix is followed.
    kept = _next_call({"running": 40, "kv": 0.6, "latency_tokens": 500}, compiled, idle={"running": 10})
    assert kept.node_id == "holder" and kept.prefix_kept


def test_queued_requests_count_toward_the_balance() -> None:
    """24 running and 10 queued (batch documents too: they take the seats the latency classes free and
    decode beside them) are 34 requests against none."""
    holder = {"running": 24, "kv": 0.6, "latency_tokens": 500}
    assert _next_call({**holder, "waiting": 8, "batch_waiting": 8}, True).prefix_kept
    assert not _next_call({**holder, "waiting": 10, "batch_waiting": 10}, True).prefix_kept


def test_an_excluded_prefix_node_is_not_kept() -> None:
    snapshot = snapshot_of({"id": "holder", **RESIDENT, "running": 24}, {"id": "idle", **RESIDENT})
    picker = _picker(True)
    _sent_to_holder(picker, snapshot)
    result = picker.pick(snapshot, query(AGENT, exclude=frozenset({"holder"}), **NEXT))
    assert result is not None and result.node_id == "idle" and not result.prefix_kept


def test_a_pick_adds_its_prompt_to_the_latency_prefill_until_the_next_heartbeat() -> None:
    """Less the prefix the chosen node holds, as the worker counts a queued sequence."""
    assert latency_tokens_of(query(AGENT, **NEXT)) == 4_000
    assert latency_tokens_of(query(AGENT, **NEXT), cached_tokens=3_900) == 100
    assert latency_tokens_of(query(CHAT, prompt_tokens=700, **NEXT)) == 700
    assert latency_tokens_of(query(BATCH, **NEXT)) == 0  # served behind the latency classes
    assert latency_tokens_of(query(WorkloadClass.EMBEDDING, prompt_tokens=50)) == 0  # no prefill queue
    snapshot = snapshot_of({"id": "a", **RESIDENT, "latency_tokens": 100})
    snapshot.add_waiting(0, batch=False, latency_tokens=4_000)
    assert snapshot.latency_prompt_tokens[0] == 4_100 and snapshot.waiting[0] == 1
