"""A small fleet that keeps changing, for tests that compare two ways of picking over the same writes:
random node specs, thermal samples, and one random snapshot write of each kind the placer makes."""

from __future__ import annotations

import numpy as np

from services.common.workload import WorkloadClass
from services.placer.cluster.records import ThermalSample
from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick import Picker
from tests.placer.pick.helpers import MODEL, NOW, node, query, snapshot_of

CLASSES = [WorkloadClass.REALTIME_CHAT, WorkloadClass.BATCH, WorkloadClass.AGENT_TOOL]


def random_spec(rng: np.random.Generator, i: int) -> dict[str, object]:
    """node() spec keys for node i: any residency, load, memory, heat, throttle bits and label."""
    running = int(rng.integers(0, 64))
    return {
        "models": {MODEL: str(rng.choice(["resident", "host", "cold"])), "qwen-7b": "cold"},
        "running": running, "waiting": int(rng.integers(0, 8)), "kv": float(rng.random()),
        "batch_running": int(rng.integers(0, running + 1)), "batch_waiting": int(rng.choice([0, 0, 2])),
        "free_gb": float(rng.choice([0, 20, 40])), "temp": float(rng.integers(40, 92)),
        "slowdown": float(rng.choice([0, 87, 90])), "shutdown": float(rng.choice([0, 95])),
        "trend": float(rng.normal(0, 0.3)),
        "reasons": int(rng.choice([0, 0, 0, 0x20, 0x4, 0x48])), "zone": f"z{i % 3}", "rack": f"r{i % 5}",
        "host": f"h{i}", "deadline": float(rng.integers(5, 40)), "draining": bool(rng.random() < 0.05),
    }  # fmt: skip


def random_sample(rng: np.random.Generator) -> ThermalSample:
    return ThermalSample(
        timestamp_s=NOW, simulated=False, temperature_c=float(rng.uniform(40, 95)),
        slowdown_temperature_c=90.0, shutdown_temperature_c=95.0,
        clock_event_reasons=int(rng.choice([0, 0x40])),
        power_w=300.0, power_limit_w=700.0, sm_clock_mhz=1800.0, sm_clock_max_mhz=1980.0, utilization=0.5,
    )  # fmt: skip


def random_write(snapshot: ClusterSnapshot, rng: np.random.Generator, step: int, ids: list[str]) -> None:
    """One random write of each kind the snapshot takes: heartbeats, thermal samples, recorded picks,
    nodes leaving and joining (the snapshot grows past its capacity of 4 early on)."""
    kind = step % 6
    node_id = ids[int(rng.integers(len(ids)))]
    if kind in (0, 1):
        snapshot.upsert(node(node_id, **random_spec(rng, len(ids))))
    elif kind == 2:
        snapshot.update_thermal(node_id, random_sample(rng), float(rng.normal(0, 0.5)))
    elif kind == 3 and node_id in snapshot.row_of:
        snapshot.add_waiting(snapshot.row_of[node_id], batch=bool(step % 2))
    elif kind == 4 and step % 24 == 4:
        snapshot.remove(node_id)
    elif kind == 5 and step % 60 == 5:
        ids.append(f"new{step}")
        snapshot.upsert(node(ids[-1], **random_spec(rng, len(ids))))


def decide_alike(one: Picker, other: Picker, rng: np.random.Generator, writes_per_pick: int) -> int:
    """400 picks by both over one churning fleet (a new model arrives halfway; time passes deadlines;
    some requests exclude a node), asserting equal decisions and explanations; how many found a node."""
    ids = [f"n{i}" for i in range(12)]
    snapshot = snapshot_of(*({"id": i, **random_spec(rng, k)} for k, i in enumerate(ids)))
    decided = 0
    for step in range(400):
        for w in range(writes_per_pick):
            random_write(snapshot, rng, step * writes_per_pick + w, ids)
        if step == 200:
            snapshot.upsert(node("q0", models={"qwen-7b": "resident", "gemma": "cold"}, weight_bytes=8 << 30))
        q = query(
            CLASSES[step % 3], model=[MODEL, "qwen-7b"][step % 7 == 0], now_s=NOW + step / 20,
            prefix_chain=(1, 10 + step % 5, 100 + step % 3)[: step % 4], caller_zone=f"z{step % 4}",
            caller_host=f"h{step % 9}",
            caller_rack=f"r{step % 6}" if step % 3 else "",
            exclude=frozenset({ids[step % len(ids)]}) if step % 4 == 0 else frozenset(),
        )  # fmt: skip
        a, b = one.pick(snapshot, q), other.pick(snapshot, q)
        assert (a is None) == (b is None), step
        if a is not None and b is not None:
            decided += 1
            assert (a.node_id, a.total, a.considered, a.last_resort) == (
                b.node_id, b.total, b.considered, b.last_resort
            ), step  # fmt: skip
            assert a.candidates == b.candidates, step
            snapshot.add_waiting(a.row, batch=q.workload_class == WorkloadClass.BATCH)  # as choose() does
    return decided
