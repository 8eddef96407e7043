"""Models coming and going on simulated GPUs: what fits where, how long a load takes, what waits on it,
and what the placer hears; then whole runs with the replica planner."""

from __future__ import annotations

import dataclasses
import heapq
import itertools

import numpy as np
import pytest

from services.common.workload import WorkloadClass
from sim.config import SimConfig, WorkloadConfig
from sim.engine_model import GpuEngine
from sim.fleet import FleetLayout
from sim.profiles import GpuProfile, ModelCost
from sim.request import Request
from sim.residency import Residency
from sim.sharegpt import conversations
from sim.simulation import Simulation
from sim.worker_loads import WorkerLoads


def decoder(name: str, weight_bytes: int) -> ModelCost:
    # 10 ms + 1 ms a row per decode step, 0.1 ms a prompt token; a load from disk 1 s, from host 0.1 s.
    return ModelCost(name, 0.010, 0.001, 0.0, 0.0001, 0.0, weight_bytes, 1000, 1.0, 0.1)


MODELS = {
    "small": decoder("small", 10**9),
    "big": decoder("big", 2 * 10**9),
    "enc": ModelCost("enc", 0.001, 0.0, 0.0, 0.00001, 0.0, 10**6, 0, 0.1, 0.01, embedding=True),
}
PROFILE = GpuProfile(
    name="test", memory_bytes=int(3.5e9 / 0.9), token_budget=2048, max_running=8,
    preempt_granularity_s=0.002, models=MODELS,
)  # fmt: skip
ARENA = 3.5e9

# (held, idle models, KV bytes in use, model to load, the victims or None when it cannot fit)
EVICTION_PLANS = [
    ("fits beside what is held", ["small", "enc"], {"small", "enc"}, 0.0, "big", []),
    ("the least recent idle model makes room", ["small", "enc"], {"small", "enc"}, 1e9, "big", ["small"]),
    ("a busy model is never evicted", ["small", "enc"], {"enc"}, 1.0e9, "big", None),
    ("KV in use leaves no room at all", ["big"], set(), 1.6e9, "small", None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "held", "idle", "kv_bytes", "model", "victims"), EVICTION_PLANS)
def test_eviction_plan(
    case: str, held: list[str], idle: set[str], kv_bytes: float, model: str, victims: list[str] | None
) -> None:
    catalog = {m: MODELS[m] for m in (*held, model)}
    residency = Residency(catalog, ARENA, host_copies=[model])
    assert list(residency.resident) == held and residency.host_copies == {model}
    assert residency.eviction_plan(model, kv_bytes, idle.__contains__) == victims, case


class Harness:
    """One GPU, its worker's loads and the event loop they need."""

    def __init__(self, models: list[str], host_copies: tuple[str, ...] = ()) -> None:
        self.events: list[tuple[float, int, str, object]] = []
        self.order = itertools.count()
        self.done: list[Request] = []
        self.engine = GpuEngine(0, PROFILE, models, self.engine_event, self.done.append, host_copies)
        self.paused = np.zeros(1, dtype=bool)
        self.moved: set[int] = set()
        self.workers = WorkerLoads([self.engine], self.paused, self.moved, self.load_end)

    def engine_event(self, when: float, engine: GpuEngine, version: int) -> None:
        heapq.heappush(self.events, (when, next(self.order), "engine", version))

    def load_end(self, when: float, g: int) -> None:
        heapq.heappush(self.events, (when, next(self.order), "loaded", g))

    def run_until(self, t_end: float) -> None:
        while self.events and self.events[0][0] <= t_end:
            when, _, kind, payload = heapq.heappop(self.events)
            if kind == "engine":
                self.engine.on_event(when, payload)  # type: ignore[arg-type]
            else:
                for request in self.workers.load_done(0, when):
                    self.engine.enqueue(request, when)


_ids = itertools.count(1)


def request(model: str, arrival: float, prompt: int = 100, output: int = 3) -> Request:
    return Request(next(_ids), WorkloadClass.REALTIME_CHAT, model, arrival, prompt, output, 0, 0, 0, (), "z")


def test_a_directive_load_pauses_the_heartbeats_and_resizes_the_kv_pool() -> None:
    h = Harness(["small"], host_copies=("big",))
    before = h.engine.kv_capacity
    h.workers.reply(0, 0.0, ["big"], [])
    assert h.paused[0] and not h.engine.serves("big")
    assert h.engine.kv_capacity == before - 2 * 10**9 // 1000  # the partition is taken at the start
    h.run_until(0.09)
    assert h.paused[0]
    h.run_until(0.1)  # a reload from the host copy: 0.1 s
    assert not h.paused[0] and h.engine.serves("big") and h.engine.serves("small")
    assert h.workers.summary()["loads_from_host_copy"] == 1
    assert h.engine.memory_free_bytes == int(h.engine.residency.arena_bytes - 3 * 10**9)


def test_a_reply_evicts_only_idle_models_and_keeps_their_weights_on_the_host() -> None:
    h = Harness(["small", "big"])
    h.engine.enqueue(request("big", 0.0, output=50), 0.0)
    h.workers.reply(0, 0.0, [], ["big", "small"])
    assert h.engine.serves("big") and not h.engine.serves("small")  # big has a request in flight
    assert h.engine.residency.host_copies == {"small"}
    h.run_until(10.0)
    assert len(h.done) == 1


def test_a_load_that_cannot_fit_ends_the_replys_handling() -> None:
    h = Harness(["big", "enc"], host_copies=("small",))
    h.engine.enqueue(request("big", 0.0, prompt=1000, output=1000), 0.0)  # big stays busy
    h.engine.kv_used = 1_400_000  # 1.4 GB of KV in use: 3.5 - 2.0 - 1.4 leaves no 1 GB for small
    h.workers.reply(0, 0.0, ["small"], ["enc"])
    assert not h.paused[0] and h.engine.serves("enc"), "the eviction after the failed load never ran"
    assert h.workers.summary()["failed_loads"] == 1


def test_a_request_for_an_evicted_model_waits_for_its_reload_and_so_does_the_next() -> None:
    h = Harness(["small"], host_copies=("big",))
    first, second = request("big", 0.0), request("big", 0.05)
    assert h.workers.request(0, 0.0, first)
    assert not h.paused[0], "a request's reload does not hold the heartbeats"
    h.run_until(0.05)
    assert h.workers.request(0, 0.05, second)  # waits on the same load
    h.run_until(10.0)
    assert {r.id for r in h.done} == {first.id, second.id}
    assert first.first_token_s > 0.1 and second.first_token_s > 0.1
    assert h.workers.summary()["reloads_for_requests"] == 1


def test_a_request_whose_reload_cannot_fit_is_refused() -> None:
    h = Harness(["big", "enc"], host_copies=("small",))
    h.engine.enqueue(request("big", 0.0, prompt=1000, output=1000), 0.0)
    h.engine.kv_used = 1_400_000
    assert not h.workers.request(0, 0.0, request("small", 0.0))


# 32 GPUs, half serving each decoder (too few for the 70B's demand), every host keeping the other decoder
# in host memory.
LAYOUT = FleetLayout(
    hosts=4, hosts_per_rack=2,
    model_sets=((("llama-70b", "minilm"), 0.5), (("llama-8b", "minilm"), 0.5)),
    host_copies=("llama-70b", "llama-8b"),
)  # fmt: skip
WORKLOAD = WorkloadConfig(duration_s=60.0)


@pytest.fixture(scope="module")
def turns() -> list:
    return conversations(300)


def summary(turns: list, layout: FleetLayout, planner: bool) -> dict:
    config = SimConfig(layout, WORKLOAD, replica_planner=planner)
    sim = Simulation(config, "ours", turns)
    sim.run()
    out = sim.summary()
    out.pop("wall_s"), out.pop("pick_us_mean")
    # The placer heard every change: each GPU's rows match what it holds.
    snapshot = sim.state.snapshot
    for g, engine in enumerate(sim.engines):
        row = snapshot.row_of[sim.fleet.node_ids[g]]
        for model, columns in snapshot.models.items():
            assert columns.resident[row] == (model in engine.residency.resident), (g, model)
            assert columns.host_copy[row] == (model in engine.residency.host_copies), (g, model)
    return out


def test_the_planner_grows_the_busy_model_onto_gpus_keeping_its_host_copy(turns: list) -> None:
    planned = summary(turns, LAYOUT, planner=True)
    loads = planned["model_loads"]
    assert loads["loads_from_host_copy"] > 0 and loads["failed_loads"] == 0
    assert planned["replica_planner"]["directives_sent"] > 0
    for name, figures in planned["classes"].items():
        assert figures["completed"] > 0 and figures["rejected"] == 0, name
    assert planned == summary(turns, LAYOUT, planner=True), "a run is deterministic"


def test_without_host_copies_the_planner_finds_nothing_to_move_and_changes_nothing(turns: list) -> None:
    fixed = dataclasses.replace(LAYOUT, host_copies=())
    planned, unplanned = summary(turns, fixed, planner=True), summary(turns, fixed, planner=False)
    assert planned["model_loads"]["loads_from_host_copy"] == planned["model_loads"]["evictions"] == 0
    planned.pop("replica_planner"), unplanned.pop("replica_planner")
    assert planned == unplanned
