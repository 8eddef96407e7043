"""The simulated cluster of bench/placer.py, seeded: worker reports, GPU samples and a mixed pick workload.

One worker per GPU (node_id "node0042-gpu3"); zones z0..z3, a rack per NODES_PER_RACK nodes, a host per
node. Six models with a skewed popularity, one to two resident per GPU, some host copies; varied load,
free memory and temperature, with a few GPUs thermally or power throttled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hanzo.inference.v1 import common_pb2, placer_pb2, telemetry_pb2
from services.common.workload import WorkloadClass
from services.placer.pick import nvml_bits

GIB = 1024**3
GPU_MEMORY_BYTES = 141 * GIB  # H200
NODES_PER_RACK = 40
ZONES = 4
EMBEDDING_MODEL = "bge-large"
# name -> (weight bytes, popularity among LLM requests; the embedding model serves EMBEDDING only)
MODELS: dict[str, tuple[int, float]] = {
    "llama-3.1-8b": (16 * GIB, 0.35),
    "mistral-7b": (14 * GIB, 0.15),
    "qwen2.5-32b": (64 * GIB, 0.15),
    "llama-3.1-70b-fp8": (70 * GIB, 0.2),
    "gemma-2-27b": (54 * GIB, 0.15),
    EMBEDDING_MODEL: (1 * GIB, 0.0),
}
LLMS = [m for m, (_, p) in MODELS.items() if p > 0]
LLM_POPULARITY = np.array([MODELS[m][1] for m in LLMS])
CLASS_MIX = {
    WorkloadClass.REALTIME_CHAT: 0.4,
    WorkloadClass.AGENT_TOOL: 0.25,
    WorkloadClass.BATCH: 0.15,
    WorkloadClass.EMBEDDING: 0.2,
}
THROTTLED_FRACTION = 0.03  # GPUs hot enough to set thermal slowdown bits
POWER_CAPPED_FRACTION = 0.03


@dataclass(frozen=True)
class ClusterShape:
    nodes: int = 1000
    gpus_per_node: int = 8

    @property
    def workers(self) -> int:
        return self.nodes * self.gpus_per_node

    def worker_id(self, worker: int) -> str:
        """Id of worker index in [0, workers): node index and GPU index."""
        node, gpu = divmod(worker, self.gpus_per_node)
        return f"node{node:04d}-gpu{gpu}"

    def topology(self, node: int) -> common_pb2.Topology:
        rack = node // NODES_PER_RACK
        racks = max(1, -(-self.nodes // NODES_PER_RACK))
        zone = rack * ZONES // racks
        return common_pb2.Topology(zone=f"z{zone}", rack=f"z{zone}-r{rack:03d}", host=f"host{node:04d}")


def node_reports(shape: ClusterShape, rng: np.random.Generator) -> list[placer_pb2.NodeReport]:
    """One heartbeat report per worker, in worker order."""
    reports = []
    for worker in range(shape.workers):
        node, gpu = divmod(worker, shape.gpus_per_node)
        resident = _resident_models(rng)
        used = sum(MODELS[m][0] for m in resident)
        others = [m for m in MODELS if m not in resident]
        host_copies = set(rng.choice(others, size=rng.integers(0, 3), replace=False).tolist())
        kv_reserved = int(rng.uniform(10, 50) * GIB)
        max_running = int(rng.choice([64, 128]))
        running = int(rng.integers(0, max_running + 1))
        waiting = int(rng.integers(0, 32)) if rng.random() < 0.2 else 0
        reports.append(
            placer_pb2.NodeReport(
                node_id=shape.worker_id(worker),
                address=f"host{node:04d}:{7000 + gpu}",
                topology=shape.topology(node),
                gpu=placer_pb2.GpuInfo(
                    index=gpu,
                    name="NVIDIA H200",
                    memory_total_bytes=GPU_MEMORY_BYTES,
                    memory_free_bytes=max(0, GPU_MEMORY_BYTES - used - kv_reserved),
                ),
                models=[
                    placer_pb2.ModelState(
                        name=m, weight_bytes=w, resident=m in resident, host_copy=m in host_copies
                    )
                    for m, (w, _) in MODELS.items()
                    if m in resident or m in host_copies
                ],
                load=placer_pb2.NodeLoad(
                    running=running,
                    waiting=waiting,
                    kv_usage=float(min(1.0, running / max_running * rng.uniform(0.6, 1.1))),
                    max_running=max_running,
                ),
                draining=bool(rng.random() < 0.005),
            )
        )
    return reports


def _resident_models(rng: np.random.Generator) -> set[str]:
    """One or two models that fit in a GPU's memory; an embedding model rides along on some."""
    first = str(rng.choice(LLMS, p=LLM_POPULARITY))
    resident = {first}
    if rng.random() < 0.3:
        second = str(rng.choice(LLMS, p=LLM_POPULARITY))
        if MODELS[first][0] + MODELS[second][0] <= 100 * GIB:
            resident.add(second)
    if rng.random() < 0.25:
        resident.add(EMBEDDING_MODEL)
    return resident


def gpu_sample(
    rng: np.random.Generator, gpu_index: int, timestamp_s: float | None = None
) -> telemetry_pb2.GpuSample:
    """A plausible reading: mostly 45-80 C; THROTTLED_FRACTION hot with thermal slowdown bits set,
    POWER_CAPPED_FRACTION at the power limit with the software power cap bit set."""
    roll = rng.random()
    slowdown_c = float(rng.choice([87.0, 90.0]))
    reasons = 0
    temperature_c = float(np.clip(rng.normal(62, 9), 30, slowdown_c - 1))
    power_limit_w = 700.0
    power_w = float(rng.uniform(150, 650))
    if roll < THROTTLED_FRACTION:
        temperature_c = float(rng.uniform(slowdown_c, slowdown_c + 4))
        reasons = nvml_bits.SW_THERMAL_SLOWDOWN | (nvml_bits.HW_THERMAL_SLOWDOWN if rng.random() < 0.5 else 0)
    elif roll < THROTTLED_FRACTION + POWER_CAPPED_FRACTION:
        reasons = nvml_bits.SW_POWER_CAP
        power_w = power_limit_w
    return telemetry_pb2.GpuSample(
        gpu_index=gpu_index,
        timestamp_s=time.time() if timestamp_s is None else timestamp_s,
        source=telemetry_pb2.TELEMETRY_SOURCE_SIMULATED,
        temperature_c=temperature_c,
        slowdown_temperature_c=slowdown_c,
        shutdown_temperature_c=slowdown_c + 8.0,
        clock_event_reasons=reasons,
        power_w=power_w,
        power_limit_w=power_limit_w,
        sm_clock_mhz=1980.0 * (0.7 if reasons else 1.0),
        sm_clock_max_mhz=1980.0,
        memory_used_bytes=int(rng.uniform(0.3, 0.95) * GPU_MEMORY_BYTES),
        memory_total_bytes=GPU_MEMORY_BYTES,
        utilization=float(rng.uniform(0.0, 1.0)),
    )


def pick_requests(shape: ClusterShape, rng: np.random.Generator, count: int) -> list[placer_pb2.PickRequest]:
    """Mixed requests: classes per CLASS_MIX, LLMs by popularity (EMBEDDING asks the embedding model),
    each LLM request with a prefix chain of an element per 128 prompt tokens (as the gateway sends it), 60%
    of them opening with one of 2,000 shared prefixes, callers with host / zone / no topology, and 3%
    excluding a worker (as after a failed attempt)."""
    classes = list(CLASS_MIX)
    class_p = np.array(list(CLASS_MIX.values()))
    prefixes = rng.integers(1, 2**63, size=2000, dtype=np.int64)
    requests = []
    for _ in range(count):
        workload = classes[rng.choice(len(classes), p=class_p)]
        embedding = workload == WorkloadClass.EMBEDDING
        request = placer_pb2.PickRequest(
            model=EMBEDDING_MODEL if embedding else str(rng.choice(LLMS, p=LLM_POPULARITY)),
            workload_class=int(workload),
            prompt_tokens=int(rng.integers(16, 4096)),
        )
        if not embedding:
            chain = rng.integers(1, 2**63, size=-(-request.prompt_tokens // 128), dtype=np.int64).tolist()
            if rng.random() < 0.6:
                chain[0] = int(rng.choice(prefixes))
            request.prefix_chain.extend(chain)
        roll = rng.random()
        caller = shape.topology(int(rng.integers(shape.nodes)))
        if roll < 0.7:
            request.caller.CopyFrom(caller)
        elif roll < 0.85:
            request.caller.zone = caller.zone
        if rng.random() < 0.03:
            request.exclude_nodes.append(shape.worker_id(int(rng.integers(shape.workers))))
        requests.append(request)
    return requests


def node_only(requests: list[placer_pb2.PickRequest]) -> list[placer_pb2.PickRequest]:
    """The requests as a remote gateway sends them: asking for the node alone (PickRequest.node_only)."""
    copies = []
    for request in requests:
        copy = placer_pb2.PickRequest()
        copy.CopyFrom(request)
        copy.node_only = True
        copies.append(copy)
    return copies
