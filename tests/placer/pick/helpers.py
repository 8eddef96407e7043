"""Build a ClusterSnapshot from compact node dicts, so pick tests read as tables."""

from __future__ import annotations

from typing import Any

from services.common.workload import WorkloadClass
from services.placer.cluster.records import ModelInfo, NodeRecord, ThermalSample
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick.query import PickQuery

NOW = 1_700_000_000.0
MODEL = "llama-8b"
GB = 1 << 30
WEIGHT_BYTES = 16 * GB

_THERMAL_KEYS = ("temp", "slowdown", "shutdown", "reasons", "power", "power_limit")


def node(node_id: str, **spec: Any) -> NodeRecord:
    """A NodeRecord with sensible defaults: idle, 80 GB GPU with 40 GB free, MODEL cold, no thermal sample.

    spec keys: models ({name: "resident" | "host" | "cold"}), weight_bytes, free_gb, running, waiting,
    max_running, batch_running, batch_waiting, latency_tokens, kv, draining, deadline (seconds after NOW),
    zone, rack, host, trend; and for a thermal sample any of temp, slowdown, shutdown, reasons, power,
    power_limit, clock (SM MHz of 1,980; slowdown/shutdown 0 = unknown).
    """
    models = spec.get("models", {MODEL: "cold"})
    weight_bytes = spec.get("weight_bytes", WEIGHT_BYTES)
    thermal = None
    if any(key in spec for key in _THERMAL_KEYS):
        thermal = ThermalSample(
            timestamp_s=NOW,
            simulated=False,
            temperature_c=spec.get("temp", 50.0),
            slowdown_temperature_c=spec.get("slowdown", 90.0),
            shutdown_temperature_c=spec.get("shutdown", 95.0),
            clock_event_reasons=spec.get("reasons", 0),
            power_w=spec.get("power", 300.0),
            power_limit_w=spec.get("power_limit", 700.0),
            sm_clock_mhz=spec.get("clock", 1800.0),
            sm_clock_max_mhz=1980.0,
            utilization=0.5,
        )
    return NodeRecord(
        node_id=node_id,
        address=f"{node_id}:50051",
        zone=spec.get("zone", ""),
        rack=spec.get("rack", ""),
        host=spec.get("host", ""),
        gpu_name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=80 * GB,
        memory_free_bytes=int(spec.get("free_gb", 40) * GB),
        models=tuple(
            ModelInfo(name, weight_bytes, resident=state == "resident", host_copy=state == "host")
            for name, state in models.items()
        ),
        running=spec.get("running", 0),
        waiting=spec.get("waiting", 0),
        kv_usage=spec.get("kv", 0.0),
        max_running=spec.get("max_running", 64),
        batch_running=spec.get("batch_running", 0),
        batch_waiting=spec.get("batch_waiting", 0),
        latency_prompt_tokens=spec.get("latency_tokens", 0),
        draining=spec.get("draining", False),
        deadline_s=NOW + spec.get("deadline", 10.0),
        thermal=thermal,
        temperature_trend_c_per_s=spec.get("trend", 0.0),
    )


def snapshot_of(*nodes: dict[str, Any]) -> ClusterSnapshot:
    """A snapshot holding one node per dict; each dict has an "id" plus node() spec keys."""
    snapshot = ClusterSnapshot(capacity=4)
    for spec in nodes:
        fields = dict(spec)
        snapshot.upsert(node(fields.pop("id"), **fields))
    return snapshot


def query(workload_class: WorkloadClass = WorkloadClass.REALTIME_CHAT, **fields: Any) -> PickQuery:
    """A PickQuery for MODEL at NOW."""
    fields.setdefault("model", MODEL)
    fields.setdefault("now_s", NOW)
    return PickQuery(workload_class=workload_class, **fields)


def by_id(snapshot: ClusterSnapshot, values: Any) -> dict[str, Any]:
    """Per-row values keyed by node id (live rows only), for readable assertions."""
    return {node_id: values[row].item() for node_id, row in snapshot.row_of.items()}
