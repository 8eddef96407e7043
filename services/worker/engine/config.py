"""Engine settings: one typed object, with the values measured at start kept apart in EngineLayout."""

from __future__ import annotations

from dataclasses import dataclass

from services.worker.engine.policy.classes import PolicyConfig, PolicyName

# Sized for real models, as vLLM's CPU backend sizes its KV space in GiB: SmolLM2-135M in float32 keeps
# 46 KB of KV per token, so 256 MiB (the old default) held 5,800 tokens and starved the batch of seats.
_DEFAULT_CPU_KV_BYTES = 2 * 1024**3


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How one decoder engine runs.

    kv_cache_bytes: byte budget of the paged KV pool; None means 2 GiB on CPU, or
    gpu_memory_utilization of the device's free memory (after loading weights) on CUDA; for an engine
    built in an arena (LLMEngine(memory=...)) None means 2 GiB on any device. A pool sized for None is
    also capped at what max_num_seqs full contexts could use.
    max_model_len: None means the checkpoint's context length.
    max_num_batched_tokens: the largest per-step token budget; the policy chooses each step's budget.
    policy: the scheduling policy, a PolicyConfig or just its name ("adaptive", "fifo"); None means
    adaptive with the default service levels of policy/classes.py.
    pack_cpu_weights: on CPU, also keep each weight in oneDNN's packed layout (models/linear.py): decode
    steps run up to 2x faster, for extra host memory the size of the weights, outside any arena.
    """

    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    kv_cache_bytes: int | None = None
    gpu_memory_utilization: float = 0.8
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    seed: int | None = 0
    policy: PolicyConfig | str | None = None
    pack_cpu_weights: bool = True

    @property
    def scheduling(self) -> PolicyConfig:
        """The policy as a PolicyConfig (the field also accepts a name, normalised at construction)."""
        assert isinstance(self.policy, PolicyConfig)  # __post_init__ made it one; not input checking
        return self.policy

    def __post_init__(self) -> None:
        if self.policy is None or isinstance(self.policy, str):
            name = PolicyName(self.policy or PolicyName.ADAPTIVE)
            object.__setattr__(self, "policy", PolicyConfig(name=name))
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes must be positive, got {self.kv_cache_bytes}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


@dataclass(frozen=True)
class EngineLayout:
    """What the engine measured and decided at start."""

    num_kv_blocks: int
    block_size: int
    kv_cache_bytes: int
    max_model_len: int


def default_kv_bytes(config: EngineConfig, device_free_bytes: int | None) -> int:
    """The KV pool budget in bytes: configured, else a fraction of free device memory, else 2 GiB."""
    if config.kv_cache_bytes is not None:
        return config.kv_cache_bytes
    if device_free_bytes is not None:
        return int(device_free_bytes * config.gpu_memory_utilization)
    return _DEFAULT_CPU_KV_BYTES
