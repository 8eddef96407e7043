"""Workload classes, numbered as in common.proto's WorkloadClass, without importing generated code."""

from __future__ import annotations

import enum


class WorkloadClass(enum.IntEnum):
    UNSPECIFIED = 0
    REALTIME_CHAT = 1  # streamed chat: time to first token
    AGENT_TOOL = 2  # tool-call steps: end-to-end latency
    BATCH = 3  # offline documents: throughput, preemptible
    EMBEDDING = 4  # many small encoder requests

    @property
    def latency_sensitive(self) -> bool:
        """Classes with a latency SLO: they avoid throttled GPUs and weigh load and heat more."""
        return self in (WorkloadClass.REALTIME_CHAT, WorkloadClass.AGENT_TOOL, WorkloadClass.EMBEDDING)
