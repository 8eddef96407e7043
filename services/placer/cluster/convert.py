"""Protobuf entries (wire and Redis format) -> the placer's NodeRecord."""

from __future__ import annotations

from hanzo.inference.v1 import cluster_state_pb2, telemetry_pb2
from services.placer.cluster.records import ModelInfo, NodeRecord, ThermalSample


def thermal_sample(sample: telemetry_pb2.GpuSample) -> ThermalSample:
    """A GpuSample as a ThermalSample."""
    return ThermalSample(
        timestamp_s=sample.timestamp_s,
        simulated=sample.source == telemetry_pb2.TELEMETRY_SOURCE_SIMULATED,
        temperature_c=sample.temperature_c,
        slowdown_temperature_c=sample.slowdown_temperature_c,
        shutdown_temperature_c=sample.shutdown_temperature_c,
        clock_event_reasons=sample.clock_event_reasons,
        power_w=sample.power_w,
        power_limit_w=sample.power_limit_w,
        sm_clock_mhz=sample.sm_clock_mhz,
        sm_clock_max_mhz=sample.sm_clock_max_mhz,
        utilization=sample.utilization,
    )


def node_record(
    entry: cluster_state_pb2.NodeEntry, thermal: cluster_state_pb2.ThermalEntry | None
) -> NodeRecord:
    """Merge a node's last heartbeat with its last thermal sample (None if it has sent none)."""
    report = entry.report
    return NodeRecord(
        node_id=report.node_id,
        address=report.address,
        zone=report.topology.zone,
        rack=report.topology.rack,
        host=report.topology.host,
        gpu_name=report.gpu.name,
        memory_total_bytes=report.gpu.memory_total_bytes,
        memory_free_bytes=report.gpu.memory_free_bytes,
        models=tuple(ModelInfo(m.name, m.weight_bytes, m.resident, m.host_copy) for m in report.models),
        running=report.load.running,
        waiting=report.load.waiting,
        kv_usage=report.load.kv_usage,
        max_running=report.load.max_running,
        batch_running=report.load.batch_running,
        batch_waiting=report.load.batch_waiting,
        latency_prompt_tokens=report.load.latency_prompt_tokens,
        draining=report.draining,
        deadline_s=entry.deadline_s,
        thermal=None if thermal is None else thermal_sample(thermal.sample),
        temperature_trend_c_per_s=0.0 if thermal is None else thermal.temperature_trend_c_per_s,
    )
