"""bench/sim_fidelity.py reads the real engines' preemptions from the workers' own Prometheus text, and
counts the simulated side's from its requests, both per class."""

from __future__ import annotations

from prometheus_client import generate_latest

from bench.fidelity_mesh_metrics import preemptions
from services.common.workload import WorkloadClass
from services.worker.server.metrics import WorkerMetrics
from sim.fidelity import CHAT_MODEL, Served, preemptions_by_class


def test_the_chat_models_preemptions_are_summed_per_class_over_the_workers() -> None:
    texts = {}
    for worker, (batch, chat) in {"worker-0": (3, 1), "worker-1": (4, 0)}.items():
        metrics = WorkerMetrics()
        metrics.preemptions.labels(CHAT_MODEL, "BATCH").inc(batch)
        metrics.preemptions.labels(CHAT_MODEL, "REALTIME_CHAT").inc(chat)
        metrics.preemptions.labels("another-model", "BATCH").inc(100)  # not the trace's decoder
        texts[worker] = generate_latest(metrics.registry).decode()
    found = preemptions(texts)
    assert found == {"realtime_chat": 1.0, "agent_tool": 0.0, "batch": 7.0, "embedding": 0.0}


def test_the_simulated_sides_preemptions_are_counted_per_class() -> None:
    def served(workload: WorkloadClass, preemptions: int) -> Served:
        return Served(workload, 0, 0, 0.0, 0.1, 1.0, 10, 5, preemptions=preemptions)

    rows = [
        served(WorkloadClass.BATCH, 2),
        served(WorkloadClass.BATCH, 1),
        served(WorkloadClass.AGENT_TOOL, 1),
    ]
    assert preemptions_by_class(rows) == {"realtime_chat": 0, "agent_tool": 1, "batch": 3, "embedding": 0}
