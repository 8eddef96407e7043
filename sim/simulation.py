"""One seeded run: a fleet, a workload and a routing policy, advanced event by event.

Events are, in time order: a session's next request (pick through the policy, then the GPU's queue),
a GPU engine's next step boundary or last token, a slice of the fleet's heartbeats and telemetry
samples (every FEED_SLICE_S, for the GPUs whose phase falls in it), and the thermal model's
once-a-second step (which may change GPUs' clocks). The placer's state lives in a ClusterState whose
clock is the simulated time, so heartbeat deadlines, memoized rankings and trends run on it too.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from services.common.workload import WorkloadClass
from services.gateway.config import GatewaySettings
from services.placer.cluster.state import ClusterState
from services.placer.pick.framework import Picker
from services.placer.pick.prefix_cost import latency_tokens_of
from services.placer.pick.query import PickQuery
from services.placer.pick.scorers import ScorerConfig
from services.placer.pick.weights import ClassWeights
from sim.config import SimConfig
from sim.engine_model import GpuEngine
from sim.feed import Feed
from sim.fleet import Fleet
from sim.latency_reserve import LatencyReserve, ours_reserve, reserve_weights
from sim.planner import PLANNER_INTERVAL_S, ReplicaPlanner
from sim.policies import POLICIES, ours_picker, picker_policy, prefix_load
from sim.request import Request
from sim.results import ClassResults
from sim.sharegpt import Conversation
from sim.thermal import FleetThermal
from sim.trace import TraceWorkload
from sim.worker_loads import WorkerLoads
from sim.workload import Workload

FEED_SLICE_S = 0.1
THERMAL_STEP_S = 1.0
TRACE_EVERY_S = 10.0
_ENGINE, _ARRIVAL, _FEED, _THERMAL, _PLAN, _LOADED = 0, 1, 2, 3, 4, 5
MAX_ATTEMPTS = GatewaySettings.max_attempts  # workers the gateway tries for one request


class Simulation:
    def __init__(
        self,
        config: SimConfig,
        policy: str,
        conversations: list[Conversation],
        workload: Workload | TraceWorkload | None = None,
    ) -> None:
        """workload: what arrives (sim/trace.py's TraceWorkload replays a fixed trace); None generates
        config.workload's."""
        self.config = config
        self.policy_name = policy
        profile = config.profile
        assert profile.thermal is not None
        self.fleet = fleet = Fleet(
            config.layout, config.cooling, profile.thermal.thermal_resistance_c_per_w, config.seed
        )
        # The fleet was serving before the run: GPUs start warm, at the steady state of steady decoding.
        self.thermal = FleetThermal(
            profile.thermal,
            fleet.inlet_c,
            fleet.resistance,
            initial_activity=profile.thermal.decode_power_fraction,
        )
        self.now = 0.0
        self._events: list[tuple[float, int, int, object, int]] = []
        self._order = itertools.count()
        copies = config.layout.host_copies
        self.engines = [
            GpuEngine(
                g, profile, list(fleet.models[g]), self._schedule_engine, self._done, copies, self._refused
            )
            for g in range(config.layout.gpus)
        ]
        self.index_of = {node_id: g for g, node_id in enumerate(fleet.node_ids)}
        self.state = ClusterState(clock=lambda: self.now)
        self.feed = Feed(self.state, fleet, self.engines, self.thermal, profile, config.seed)
        self.weights: dict[str, dict[str, float]] | None = None  # ours's, as the summary reports them
        self.planner: ReplicaPlanner | None = None
        self.workers = WorkerLoads(self.engines, self.feed.paused, self.feed.moved, self._load_end)
        if policy == "ours" and config.replica_planner:
            self.planner = ReplicaPlanner(self.engines, fleet.node_ids, profile)
        self.workload = workload or Workload(
            config.workload, config.layout.gpus, fleet.zone_names, conversations, config.seed
        )
        self.reserve: LatencyReserve | None = None
        self.picker: Picker | None = None  # ours's, for its counts
        weights: ClassWeights | None = None
        if policy in ("ours", "ours_no_prefix_cost"):
            weights = ClassWeights.from_config(config.class_weights)
            scorer_config = ScorerConfig(node_reserve_fraction=config.node_reserve_fraction)
            self.picker = ours_picker(config.seed, weights, policy == "ours", scorer_config)
            self.choose = picker_policy(self.picker)
        elif policy == "ours_reserve":
            weights = reserve_weights(config.class_weights)
            self.reserve = LatencyReserve(self.workload.models.batch, config.reserve_seats)
            self.choose = ours_reserve(config.seed, weights, self.reserve)
        elif policy == "prefix_load":
            self.choose = prefix_load(config.seed, self.kv_blocks)  # llm-d's index auto-tuned to the KV
        else:
            self.choose = POLICIES[policy](config.seed)
        if weights is not None:
            self.weights = {wc.name.lower(): dict(w) for wc, w in weights.by_class.items()}
        self.classes = {wc: ClassResults(slo) for wc, slo in config.slos.items()}
        self.in_flight = 0
        # The CPU mesh's shared cores (GpuProfile.host_slowdown_per_request), and the requests in flight the
        # engines' clocks were last set for.
        self.host_slowdown = profile.host_slowdown_per_request
        self.clocked_in_flight = 0
        self.not_found = 0  # picks of a node that did not hold the model (the gateway tries another)
        self.exhausted = 0  # picks of a node that could not reload it (no room)
        self.rejected: list[Request] = []  # requests no worker served, in the order they were refused
        self.picks = 0
        self.pick_s = 0.0
        self.trace: list[tuple[float, float, float, float, float]] = []  # t, temperature p50/p90/p99/max
        self.wall_s = 0.0

    def kv_blocks(self, node_id: str) -> int:
        """The KV blocks of node_id's GPU (what its server reports as vLLM's num_gpu_blocks)."""
        engine = self.engines[self.index_of[node_id]]
        return int(engine.kv_capacity) // self.config.profile.block_tokens

    # --- the loop -------------------------------------------------------------------------------------

    def run(self) -> None:
        """Advance the fleet to the workload's end. The cyclic garbage collector is off meanwhile: a run
        keeps millions of objects alive (requests, sessions, results) and makes next to no cycles, so
        the collector's passes over them were wasted, a sixth of a run (random routing, 1,000 GPUs, 10
        simulated minutes: 7.4 of 49 s in collections, and 0.36 million objects in cycles for the one
        collection that follows the run)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._run()
        finally:
            if enabled:
                gc.enable()

    def _run(self) -> None:
        started = time.perf_counter()
        duration = self.config.workload.duration_s
        self.feed.send(*self.feed.due(0.0, 1.0), 0.0)  # every GPU reports once before the first request
        self._push(FEED_SLICE_S, _FEED, None)
        self._push(THERMAL_STEP_S, _THERMAL, None)
        if self.planner is not None:
            self._push(PLANNER_INTERVAL_S, _PLAN, None)
        arrivals: Iterator[Request] = self.workload.arrivals()
        pending = next(arrivals, None)
        events = self._events
        contended = self.host_slowdown > 0.0
        while True:
            if contended and self.in_flight != self.clocked_in_flight:
                self._share_host()  # after the last event, at its time: nothing happened in between
            if pending is not None and (not events or pending.arrival_s <= events[0][0]):
                self.now = pending.arrival_s
                self._arrive(pending)
                pending = next(arrivals, None)
                continue
            if not events:
                break
            when, _, kind, payload, version = heapq.heappop(events)
            if when >= duration:
                break
            self.now = when
            if kind == _ENGINE:
                payload.on_event(when, version)  # type: ignore[attr-defined]
            elif kind == _ARRIVAL:
                self._arrive(payload)  # type: ignore[arg-type]
            elif kind == _FEED:
                self._beats(when)
                self._push(when + FEED_SLICE_S, _FEED, None)
            elif kind == _THERMAL:
                self._thermal_step(when)
                self._push(when + THERMAL_STEP_S, _THERMAL, None)
            elif kind == _PLAN:
                assert self.planner is not None
                self.planner.plan(self.state, when)
                self._push(when + PLANNER_INTERVAL_S, _PLAN, None)
            else:
                self._loaded(payload, when)  # type: ignore[arg-type]
        self.now = duration
        self.wall_s = time.perf_counter() - started

    def _push(self, when: float, kind: int, payload: object, version: int = 0) -> None:
        heapq.heappush(self._events, (when, next(self._order), kind, payload, version))

    def _schedule_engine(self, when: float, engine: GpuEngine, version: int) -> None:
        self._push(when, _ENGINE, engine, version)

    def _beats(self, now: float) -> None:
        """A slice's heartbeats and samples, then the replies of those that carry a directive."""
        gpus, when = self.feed.due(now, now + FEED_SLICE_S)
        self.feed.send(gpus, when, now)
        if self.planner is not None:
            self.planner.follow(gpus, when, self.workers)

    def _load_end(self, when: float, g: int) -> None:
        self._push(when, _LOADED, g)

    def _loaded(self, g: int, now: float) -> None:
        engine = self.engines[g]
        for request in self.workers.load_done(g, now):
            engine.enqueue(request, now)
        for request in self.workers.refused:
            self.in_flight -= 1
            self._reject(request)
        self.workers.refused.clear()

    def _arrive(self, request: Request) -> None:
        """Pick a worker for request and hand it over, trying others as the gateway does (up to
        MAX_ATTEMPTS workers for the request in all, each that failed it excluded from the next pick)."""
        query = PickQuery(
            model=request.model,
            workload_class=request.workload,
            caller_zone=request.caller_zone,
            caller_rack=self.config.caller_rack,
            prefix_chain=request.prefix_chain,
            prefix_chain_tokens=request.prefix_ends,
            prompt_tokens=request.prompt,
            now_s=self.now,
            explain_top=0,  # as the gateway asks
            exclude=request.excluded,
        )
        while request.attempts < MAX_ATTEMPTS:
            request.attempts += 1
            started = time.perf_counter()
            self.state.expire()
            choice = self.choose(self.state, query)
            self.pick_s += time.perf_counter() - started
            self.picks += 1
            if choice is None:
                break
            if self.planner is not None:
                self.planner.record_pick(request)
            node_id = choice.node_id
            row = self.state.snapshot.row_of[node_id]
            self.state.record_pick(row, request.workload, latency_tokens_of(query, choice.cached_tokens))
            g = self.index_of[node_id]
            engine = self.engines[g]
            if engine.serves(request.model):
                self.in_flight += 1
                engine.enqueue(request, self.now)
                return
            if request.model in engine.residency.host_copies:  # the worker reloads it first
                if self.workers.request(g, self.now, request):
                    self.in_flight += 1
                    return
                self.exhausted += 1  # RESOURCE_EXHAUSTED: no room for it there
            else:
                self.not_found += 1  # NOT_FOUND: the placer's view was a beat behind
            request.excluded = request.excluded | {node_id}  # the gateway tries another
            query = replace(query, exclude=request.excluded)
        self._reject(request)

    def _reject(self, request: Request) -> None:
        """No worker took request: the caller gets an error and its session ends there."""
        self.classes[request.workload].rejected += 1
        self.rejected.append(request)

    def _refused(self, request: Request) -> None:
        """A worker refused request after its queue timeout (RESOURCE_EXHAUSTED, nothing sent yet): the
        gateway tries another worker at once."""
        self.in_flight -= 1
        request.excluded = request.excluded | {self.fleet.node_ids[request.gpu]}
        request.gpu = -1
        self._arrive(request)

    def _done(self, request: Request) -> None:
        self.in_flight -= 1
        same_zone = self.fleet.zone_labels[request.gpu] == request.caller_zone
        results = self.classes[request.workload]
        results.record(request, self.config.network.round_trip_s(same_zone))
        results.cross_zone += not same_zone
        follow = self.workload.follow_up(request)
        if follow is not None:
            self._push(follow.arrival_s, _ARRIVAL, follow)

    def _host_share(self) -> float:
        """The share of its speed an engine keeps beside the requests in flight on a shared host (1.0
        without host contention)."""
        return 1.0 / (1.0 + self.host_slowdown * self.clocked_in_flight)

    def _share_host(self) -> None:
        """Every engine's clock for the requests in flight now: its thermal factor times the host share."""
        self.clocked_in_flight = self.in_flight
        share = self._host_share()
        clock = self.thermal.clock
        for g, engine in enumerate(self.engines):
            engine.set_clock(self.now, float(clock[g]) * share)

    def _thermal_step(self, now: float) -> None:
        engines = self.engines
        for engine in engines:
            engine.advance(now)
        prefill = np.fromiter((e.busy_prefill_s for e in engines), float, len(engines))
        decode = np.fromiter((e.busy_decode_s for e in engines), float, len(engines))
        for engine in engines:
            engine.busy_prefill_s = engine.busy_decode_s = 0.0
        thermal = self.thermal
        share = self._host_share()
        for g in thermal.step(THERMAL_STEP_S, prefill, decode).tolist():
            engines[g].set_clock(now, float(thermal.clock[g]) * share)
        if now % TRACE_EVERY_S < THERMAL_STEP_S / 2:
            t = thermal.temperature_c
            self.trace.append((now, *np.percentile(t, [50, 90, 99]).tolist(), float(t.max())))

    # --- what it measured -----------------------------------------------------------------------------

    def unfinished(self) -> dict[WorkloadClass, int]:
        counts = dict.fromkeys(self.classes, 0)
        for engine in self.engines:
            queued = [r for queue in engine.waiting for r in queue]
            for request in itertools.chain(queued, engine.prefilling, (r for _, _, r in engine.running)):
                counts[request.workload] += 1
        return counts

    def offered_load(self) -> float:
        """How busy the fleet was at the profile's best efficiency: the prompt tokens' compute plus each
        generated token at its share of a full decode step (128 rows of 2,000-token contexts), over
        the fleet's GPU-seconds. Unlike NVML's utilisation (any step running counts as busy, so a GPU
        decoding one sequence reads 100%), this says how much of the fleet's capacity the work used."""
        reference = self.config.profile.model(self.workload.models.chat)
        rows, context = 128, 2000
        step = reference.base_s + rows * reference.per_row_s + rows * context * reference.per_context_token_s
        work = sum(e.prefill_compute_s + e.decoded_tokens * step / rows for e in self.engines)
        return work / (len(self.engines) * self.config.workload.duration_s)

    def summary(self) -> dict[str, object]:
        duration = self.config.workload.duration_s
        unfinished = self.unfinished()
        thermal = self.thermal
        engines = self.engines
        return {
            "policy": self.policy_name,
            "class_weights": self.weights,
            # ours's node reserve (where its class weights weigh node_reserve)
            "node_reserve_fraction": None if self.weights is None else self.config.node_reserve_fraction,
            "offered_load": self.offered_load(),
            "classes": {
                wc.name.lower(): results.summary(duration, unfinished[wc])
                for wc, results in self.classes.items()
            },
            "throttle_events": thermal.throttle_events,
            "throttled_gpu_s": thermal.throttled_gpu_s,
            "peak_temperature_c": thermal.peak_c,
            "cross_zone_requests": sum(r.cross_zone for r in self.classes.values()),
            "prefix_hits": sum(e.prefix_hits for e in engines),
            "prefix_tokens_saved": sum(e.prefix_tokens_saved for e in engines),
            # Sequences whose KV was dropped (a better-ranked prompt needed the seat or blocks, or the pool
            # ran out) and the prompt tokens computed again for them.
            "preemptions": sum(e.preemptions for e in engines),
            "recomputed_tokens": sum(e.recomputed_tokens for e in engines),
            "retries": {
                "not_found": self.not_found,
                "resource_exhausted": self.exhausted,
                "queue_timeout": sum(e.queue_timeouts for e in engines),
            },
            "model_loads": self.workers.summary(),
            "replica_planner": None if self.planner is None else self.planner.summary(),
            "latency_reserve": None if self.reserve is None else self.reserve.summary(),
            "picks": self.picks,
            # Picks the prefix cost rule moved to the node holding the prompt's prefix (ours's).
            "prefix_kept": None if self.picker is None else self.picker.prefix_kept,
            "pick_us_mean": self.pick_s / self.picks * 1e6 if self.picks else None,
            "wall_s": self.wall_s,
        }
