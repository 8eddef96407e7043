"""What the placer hears from the simulated fleet, through the placer's own cluster state.

Each GPU heartbeats and each telemetry agent samples once per interval (1 s, as the worker and agent
default to), at a phase of its own, so the placer's state changes a little at a time as it does in a
real fleet. A GPU's first heartbeat is the NodeEntry a worker's Heartbeat becomes (load, models, memory,
topology) and its first sample a GpuSample, taken through ClusterState.apply_node / thermal_entry /
apply_thermal as the placer takes them. After that a heartbeat moves only the load (the fleet's models
are fixed), so a slice's heartbeats and samples go to the same snapshot columns at once
(ClusterState.apply_loads / apply_samples: the same values, trends smoothed the same way, one
vectorised write a column instead of a protobuf a GPU, which was a quarter of a run's time at 1,000
GPUs). Nothing here reaches a socket or Redis.
"""

from __future__ import annotations

import numpy as np

from hanzo.inference.v1 import cluster_state_pb2, common_pb2, placer_pb2, telemetry_pb2
from services.placer.cluster.batches import LoadBatch, ThermalBatch
from services.placer.cluster.state import ClusterState
from sim.engine_model import GpuEngine
from sim.fleet import Fleet
from sim.profiles import GpuProfile
from sim.thermal import FleetThermal

HEARTBEAT_INTERVAL_S = 1.0  # WorkerSettings.heartbeat_interval_s
SAMPLE_INTERVAL_S = 1.0  # the telemetry agent's interval_s
NODE_TTL_S = 3 * HEARTBEAT_INTERVAL_S  # the placer's node TTL: three missed heartbeats


class Feed:
    def __init__(
        self,
        state: ClusterState,
        fleet: Fleet,
        engines: list[GpuEngine],
        thermal: FleetThermal,
        profile: GpuProfile,
        seed: int,
    ) -> None:
        self.state = state
        self.fleet = fleet
        self.engines = engines
        self.thermal = thermal
        self.profile = profile
        # Each GPU's phase within the interval: a fraction, the same for its heartbeat and its sample.
        self.phase = np.random.default_rng([seed, 5]).random(len(engines))
        self._templates = [self._template(g) for g in range(len(engines))]
        self._registered = np.zeros(len(engines), dtype=bool)  # sent its first, full heartbeat
        self.paused = np.zeros(len(engines), dtype=bool)  # loading: its heartbeat loop waits on the load
        self.moved: set[int] = set()  # GPUs whose models changed since their last full heartbeat

    def _template(self, g: int) -> placer_pb2.NodeReport:
        engine, fleet = self.engines[g], self.fleet
        report = placer_pb2.NodeReport(
            node_id=fleet.node_ids[g],
            address=f"{fleet.node_ids[g]}:50051",
            topology=common_pb2.Topology(
                zone=fleet.zone_labels[g], rack=fleet.rack_labels[g], host=fleet.host_labels[g]
            ),
            gpu=placer_pb2.GpuInfo(
                index=g % fleet.layout.gpus_per_host,
                name=self.profile.name,
                memory_total_bytes=self.profile.memory_bytes,
                memory_free_bytes=engine.memory_free_bytes,
            ),
        )
        residency = engine.residency
        for name in [*residency.resident, *sorted(residency.host_copies)]:
            cost = residency.catalog[name]
            report.models.add(
                name=name,
                weight_bytes=cost.weight_bytes,
                resident=name in residency.resident,
                host_copy=name in residency.host_copies,
                kind="embed" if cost.embedding else "generate",
            )
        report.load.max_running = self.profile.max_running
        return report

    def due(self, start_s: float, end_s: float) -> tuple[np.ndarray, np.ndarray]:
        """The GPUs whose phase falls in [start_s, end_s) (at most one interval long), and their times,
        but those paused by a load."""
        a = start_s % HEARTBEAT_INTERVAL_S / HEARTBEAT_INTERVAL_S
        b = a + (end_s - start_s) / HEARTBEAT_INTERVAL_S
        phase = self.phase
        due = (phase >= a) & (phase < b) if b <= 1.0 else (phase >= a) | (phase < b - 1.0)
        gpus = np.flatnonzero(due & ~self.paused)
        return gpus, start_s + ((phase[gpus] - a) % 1.0) * HEARTBEAT_INTERVAL_S

    def send(self, gpus: np.ndarray, when: np.ndarray, now: float) -> None:
        """Heartbeats and samples of gpus at times when (Feed.due), sent at the simulation's time now (the
        slice's start, which when may lie up to a slice past). A GPU's first heartbeat, and its first
        after its models changed, goes through the placer's protobuf path (apply_node: a full
        NodeReport); the others move only the load, and go to the same snapshot columns in one batch a
        slice (apply_loads, apply_samples), each with its own phase's time.

        The engines report as of now, never later: an engine brought to a time past the simulation's
        would take what happens before it (an arrival, a prompt's end) as happening then, and its decodes
        would make no progress until the simulation caught up (up to a slice, 0.1 s, at every heartbeat).
        """
        engines = self.engines
        for g in gpus.tolist():
            engines[g].advance(now)
        full = ~self._registered[gpus]
        if self.moved:
            full |= np.isin(gpus, list(self.moved))
        for g, stamp in zip(gpus[full].tolist(), when[full].tolist(), strict=True):
            if self._registered[g]:
                self._templates[g] = self._template(g)
                self.moved.discard(g)
            self._registered[g] = True
            self.heartbeat(g, stamp)
            self.sample(g, stamp)
        known = ~full
        if known.any():
            self._send_batch(gpus[known], when[known])

    def _send_batch(self, gpus: np.ndarray, when: np.ndarray) -> None:
        engines, row_of, node_ids = self.engines, self.state.snapshot.row_of, self.fleet.node_ids
        beating = [engines[g] for g in gpus.tolist()]
        rows = np.fromiter((row_of[node_ids[g]] for g in gpus.tolist()), np.int64, len(gpus))
        self.state.apply_loads(
            LoadBatch(
                rows=rows,
                deadline_s=when + NODE_TTL_S,
                running=np.fromiter((e.num_running for e in beating), float, len(beating)),
                waiting=np.fromiter((e.num_waiting for e in beating), float, len(beating)),
                max_running=self.profile.max_running,
                batch_running=np.fromiter((e.batch_running for e in beating), float, len(beating)),
                batch_waiting=np.fromiter((len(e.waiting[2]) for e in beating), float, len(beating)),
                latency_prompt_tokens=np.fromiter(
                    (e.latency_prompt_tokens() for e in beating), float, len(beating)
                ),
                kv_usage=np.fromiter((e.kv_usage() for e in beating), float, len(beating)),
                memory_free_bytes=self._memory_free(beating),
            )
        )
        thermal, p = self.thermal, self.profile.thermal
        assert p is not None
        self.state.apply_samples(
            ThermalBatch(
                rows=rows,
                timestamp_s=when,
                temperature_c=thermal.temperature_c[gpus],
                simulated=True,
                slowdown_temperature_c=p.slowdown_c,
                shutdown_temperature_c=p.shutdown_c,
                clock_event_reasons=thermal.reasons[gpus],
                power_w=thermal.power_w[gpus],
                power_limit_w=p.tdp_w,
                sm_clock_mhz=p.max_sm_clock_mhz * thermal.clock[gpus],
                sm_clock_max_mhz=p.max_sm_clock_mhz,
                utilization=thermal.utilization[gpus],
            )
        )

    @staticmethod
    def _memory_free(beating: list[GpuEngine]) -> np.ndarray:
        """Each engine's memory_free_bytes, vectorised."""
        free = (e.unweighted_bytes - e.kv_used * e.kv_bytes_per_token for e in beating)
        return np.maximum(np.trunc(np.fromiter(free, float, len(beating))), 0.0)

    def heartbeat(self, g: int, now: float) -> None:
        """g's heartbeat, stamped now, of its engine as it stands (send advanced it)."""
        engine = self.engines[g]
        entry = cluster_state_pb2.NodeEntry(deadline_s=now + NODE_TTL_S)
        report = entry.report
        report.CopyFrom(self._templates[g])
        report.gpu.memory_free_bytes = engine.memory_free_bytes
        load = report.load
        load.running = engine.num_running
        load.waiting = engine.num_waiting
        load.kv_usage = engine.kv_usage()
        load.batch_running = engine.batch_running
        load.batch_waiting = len(engine.waiting[2])
        load.latency_prompt_tokens = engine.latency_prompt_tokens()
        self.state.apply_node(entry)

    def sample(self, g: int, now: float) -> None:
        thermal, p = self.thermal, self.profile.thermal
        assert p is not None
        reading = telemetry_pb2.GpuSample(
            gpu_index=g % self.fleet.layout.gpus_per_host,
            timestamp_s=now,
            source=telemetry_pb2.TELEMETRY_SOURCE_SIMULATED,
            temperature_c=float(thermal.temperature_c[g]),
            slowdown_temperature_c=p.slowdown_c,
            shutdown_temperature_c=p.shutdown_c,
            clock_event_reasons=int(thermal.reasons[g]),
            power_w=float(thermal.power_w[g]),
            power_limit_w=p.tdp_w,
            sm_clock_mhz=p.max_sm_clock_mhz * float(thermal.clock[g]),
            sm_clock_max_mhz=p.max_sm_clock_mhz,
            memory_total_bytes=self.profile.memory_bytes,
            utilization=float(thermal.utilization[g]),
        )
        node_id = self.fleet.node_ids[g]
        self.state.apply_thermal(node_id, self.state.thermal_entry(node_id, reading))
