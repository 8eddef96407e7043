"""The demo's seeded plan: class mix, arrivals, what each class's requests carry (messages, tools, long
documents), the one greedy probe; and the real models every worker holds."""

from __future__ import annotations

import json

import pytest

from services.common.workload import WorkloadClass
from services.mesh.models import CHAT_MODEL, EMBED_MODEL, ModelSet, prepare_models
from services.mesh.workload import DEFAULT_MIX, PROBE_EXPECT, PROBE_QUESTION, class_counts, plan_workload

ALL_CLASSES = set(DEFAULT_MIX)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 24, 120, 1000])
def test_class_counts_add_up_and_cover_every_class(n: int) -> None:
    counts = class_counts(n)
    assert sum(counts.values()) == n
    if n >= len(ALL_CLASSES):
        assert all(counts[c] >= 1 for c in ALL_CLASSES)


def test_plan_is_seeded() -> None:
    assert plan_workload(120, seed=7) == plan_workload(120, seed=7)
    assert plan_workload(120, seed=7) != plan_workload(120, seed=8)


@pytest.mark.parametrize("n", [4, 24, 120])
def test_plan_has_every_class_in_arrival_order(n: int) -> None:
    plan = plan_workload(n, seed=0, rate_rps=6.0)
    assert [p.index for p in plan] == list(range(n))
    assert {p.workload_class for p in plan} == ALL_CLASSES
    arrivals = [p.arrival_s for p in plan]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0


def test_plan_requests_fit_their_class() -> None:
    plan = plan_workload(120, seed=3)
    by = {c: [p for p in plan if p.workload_class is c] for c in ALL_CLASSES}
    assert all(p.model == EMBED_MODEL and p.texts and p.rpc == "Embed" for p in by[WorkloadClass.EMBEDDING])
    # Chats are Chat calls with real messages ending in the user's turn; some carry a system message,
    # some are a second turn; half leave classification to the gateway; none offers tools.
    chats = by[WorkloadClass.REALTIME_CHAT]
    assert all(p.model == CHAT_MODEL and p.rpc == "Chat" and not p.tools for p in chats)
    assert all(p.messages[-1][0] == "user" and p.messages[-1][1].endswith(("?", ".")) for p in chats)
    assert any(p.messages[0][0] == "system" for p in chats)
    assert any([r for r, _ in p.messages] == ["user", "assistant", "user"] for p in chats)
    assert all(16 <= p.max_tokens <= 48 for p in chats)
    assert {p.declare_class for p in chats} == {True, False}
    assert all(0 < p.temperature < 1 for p in chats if not p.expect)
    # Agent calls offer functions with JSON Schema parameters, and are left for the gateway to classify
    # (a chat offering tools is an agent call).
    for p in by[WorkloadClass.AGENT_TOOL]:
        assert p.rpc == "Chat" and p.model == CHAT_MODEL and len(p.tools) == 2 and not p.declare_class
        assert 24 <= p.max_tokens <= 48
        for tool in p.tools:
            schema = json.loads(tool.parameters_json)
            assert tool.name and tool.description and schema["type"] == "object" and schema["required"]
    assert {t.name for p in by[WorkloadClass.AGENT_TOOL] for t in p.tools} >= {"get_weather", "search"}
    # Batch documents are long, declared, run to their full length, and come over both routes.
    batch = by[WorkloadClass.BATCH]
    assert all(p.model == CHAT_MODEL and p.declare_class and p.ignore_eos for p in batch)
    assert all(48 <= p.max_tokens <= 96 and "ummarize" in p.asked for p in batch)
    assert {p.rpc for p in batch} == {"Chat", "Generate"}
    assert min(len(p.asked) for p in batch) > max(len(p.asked) for p in chats)


@pytest.mark.parametrize(("n", "seed"), [(1, 0), (4, 1), (24, 0), (120, 0), (120, 5)])
def test_plan_has_one_greedy_probe(n: int, seed: int) -> None:
    plan = plan_workload(n, seed=seed)
    probes = [p for p in plan if p.expect]
    assert len(probes) == 1, probes
    (probe,) = probes
    assert probe.workload_class is WorkloadClass.REALTIME_CHAT and probe.rpc == "Chat"
    assert probe.messages == (("user", PROBE_QUESTION),) and probe.expect == PROBE_EXPECT == "Paris"
    assert probe.temperature == 0 and not probe.ignore_eos and 8 <= probe.max_tokens <= 48
    # It is the first chat, so the class mix and the arrivals stay as they were.
    assert probe is next(p for p in plan if p.workload_class is WorkloadClass.REALTIME_CHAT)
    assert (
        len(plan) == n
        and sum(p.workload_class is WorkloadClass.REALTIME_CHAT for p in plan)
        == (class_counts(n)[WorkloadClass.REALTIME_CHAT])
    )


def test_demo_models_are_real_and_on_every_worker() -> None:
    models = prepare_models()
    assert set(models.paths) == {CHAT_MODEL, EMBED_MODEL} and not models.odd_workers_only
    assert models.paths[CHAT_MODEL].suffix == ".gguf" and models.paths[CHAT_MODEL].is_file()
    assert models.paths[EMBED_MODEL].is_dir()
    assert models.for_worker(0) == models.for_worker(1) == dict(models.paths)
    odd = ModelSet(dict(models.paths), odd_workers_only=frozenset({EMBED_MODEL}))
    assert list(odd.for_worker(0)) == [CHAT_MODEL] and list(odd.for_worker(1)) == [CHAT_MODEL, EMBED_MODEL]


@pytest.mark.parametrize(("n", "rate"), [(0, 1.0), (5, 0.0)])
def test_plan_rejects_bad_arguments(n: int, rate: float) -> None:
    with pytest.raises(ValueError):
        plan_workload(n, seed=0, rate_rps=rate)
