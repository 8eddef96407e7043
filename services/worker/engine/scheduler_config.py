"""The scheduler's per-step limits and its policy choice."""

from __future__ import annotations

from dataclasses import dataclass

from services.worker.engine.policy.classes import PolicyConfig


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Per-step limits. watermark: fraction of blocks left free when admitting new work, so a fresh
    admission does not force a preemption on the very next decode step. max_num_batched_tokens is
    the largest budget a step may get; the policy picks each step's budget up to it.
    policy: None means adaptive with the default service levels of policy/classes.py."""

    max_model_len: int
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    watermark: float = 0.01
    policy: PolicyConfig | None = None

    def __post_init__(self) -> None:
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
