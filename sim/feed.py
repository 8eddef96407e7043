"""What the placer hears from the simulated fleet, through the placer's own cluster state.

Each GPU heartbeats and each telemetry agent samples once per interval (1 s, as the worker and agent
default to), at a phase of its own, so the placer's state changes a little at a time as it does in a
real fleet. A heartbeat is the NodeEntry a worker's Heartbeat becomes (load, models, memory, topology);
a sample is a GpuSample, smoothed into a trend by the same ClusterState.thermal_entry the placer runs.
Nothing here reaches a socket or Redis.
"""

from __future__ import annotations

import numpy as np

from hanzo.inference.v1 import cluster_state_pb2, common_pb2, placer_pb2, telemetry_pb2
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
        self._next_slot = 0.0

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
        for name, cost in engine.costs.items():
            report.models.add(
                name=name,
                weight_bytes=cost.weight_bytes,
                resident=True,
                kind="embed" if cost.embedding else "generate",
            )
        report.load.max_running = self.profile.max_running
        return report

    def send(self, start_s: float, end_s: float) -> None:
        """Heartbeats and samples of every GPU whose phase falls in [start_s, end_s) (end_s - start_s at
        most one interval)."""
        a = start_s % HEARTBEAT_INTERVAL_S / HEARTBEAT_INTERVAL_S
        b = a + (end_s - start_s) / HEARTBEAT_INTERVAL_S
        phase = self.phase
        due = (phase >= a) & (phase < b) if b <= 1.0 else (phase >= a) | (phase < b - 1.0)
        for g in np.flatnonzero(due).tolist():
            when = start_s + ((phase[g] - a) % 1.0) * HEARTBEAT_INTERVAL_S
            self.heartbeat(g, when)
            self.sample(g, when)

    def heartbeat(self, g: int, now: float) -> None:
        engine = self.engines[g]
        engine.advance(now)
        entry = cluster_state_pb2.NodeEntry(deadline_s=now + NODE_TTL_S)
        report = entry.report
        report.CopyFrom(self._templates[g])
        load = report.load
        load.running = engine.num_running
        load.waiting = engine.num_waiting
        load.kv_usage = engine.kv_usage()
        load.batch_running = engine.batch_running
        load.batch_waiting = len(engine.waiting[2])
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
