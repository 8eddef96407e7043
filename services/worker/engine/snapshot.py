"""What the engine thread publishes about its engine after every step: queue depths, KV usage and the
cumulative counters. The event loop's readers (the servicer's stats, heartbeats, metrics) read the
latest snapshot, never the scheduler's or block manager's live structures, which the engine thread
mutates while they would be read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.common.workload import WorkloadClass

if TYPE_CHECKING:  # a type only: this module is imported by AsyncLLM, which holds the engine
    from services.worker.engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class EngineSnapshot:
    running: int = 0
    waiting: int = 0
    batch_running: int = 0  # of running and waiting, the BATCH class's (the heartbeat reports them)
    batch_waiting: int = 0
    latency_prompt_tokens: int = 0  # Scheduler.latency_prompt_tokens (the heartbeat reports it)
    kv_usage: float = 0.0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    prefix_hit_tokens: int = 0
    steps: int = 0
    last_budget: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    urgent_steps: int = 0
    # Copies made on the engine thread: the engine's own Counters keep growing while these are read.
    preemptions_by_class: Mapping[WorkloadClass, int] = field(default_factory=dict)
    steps_by_budget: Mapping[int, int] = field(default_factory=dict)
    steps_by_tokens: Mapping[int, int] = field(default_factory=dict)  # iteration_bucket -> steps
    tokens_computed: int = 0


def snapshot_of(engine: LLMEngine) -> EngineSnapshot:
    """The engine's state now; call on the engine's thread (between steps)."""
    blocks = engine.block_manager
    stats = engine.stats
    return EngineSnapshot(
        running=engine.scheduler.num_running,
        waiting=engine.scheduler.num_waiting,
        batch_running=engine.scheduler.running_of(WorkloadClass.BATCH),
        batch_waiting=engine.scheduler.waiting_of(WorkloadClass.BATCH),
        latency_prompt_tokens=engine.scheduler.latency_prompt_tokens(),
        kv_usage=blocks.usage,
        kv_blocks_total=blocks.num_blocks,
        kv_blocks_used=blocks.num_used_blocks,
        prefix_hit_tokens=blocks.prefix_hit_tokens,
        steps=stats.steps,
        last_budget=stats.last_budget,
        generated_tokens=stats.generated_tokens,
        preemptions=stats.preemptions,
        urgent_steps=stats.urgent_steps,
        preemptions_by_class=dict(stats.preemptions_by_class),
        steps_by_budget=dict(stats.steps_by_budget),
        steps_by_tokens=dict(stats.steps_by_tokens),
        tokens_computed=stats.tokens_computed,
    )
