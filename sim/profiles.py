"""What a simulated GPU is: how long an engine step takes, how much KV it holds, how it heats.

Step time has one form for every profile, linear in what a continuous-batching step does:

    step_s = base_s (each model with work in the step: its weights streamed once)
           + per_row_s x decode rows
           + per_context_token_s x context tokens the decodes attend to
           + per_prefill_token_s x prompt tokens computed in the step
           + per_prefill_attention_s x the (query, key) pairs the prompt chunks attend (the quadratic
             part: n(n + 1) / 2 for a chunk from position 0, n x (start + n) for one continuing a
             prompt; services/worker/engine/attention_work.py)

all divided by the GPU's clock factor while it throttles. A GPU profile derives the coefficients from
public roofline figures (bandwidth, FLOP/s, an efficiency); the CPU profile fits them to step times
the real engine measured on this machine (sim/calibrate.py). The roofline sums the memory and compute
terms where max() would be exact, so mixed steps come out up to ~2x slow on paper; measured CPU steps
are close to additive, and the GPU fleet runs compare policies on the same profile, so the error is
shared, not a bias between policies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.worker.engine.attention_work import attended_pairs
from services.worker.engine.policy.classes import PolicyConfig
from services.worker.engine.scheduler_config import SchedulerConfig

# The worker's admission defaults, which every simulated engine follows (its adaptive policy).
_POLICY = PolicyConfig()


@dataclass(frozen=True)
class ModelCost:
    """One served model on one GPU profile. weight_bytes: what loading it needs; kv_bytes_per_token:
    every layer's K and V for one token; load_s / reload_s: from its checkpoint / from a host copy."""

    name: str
    base_s: float
    per_row_s: float
    per_context_token_s: float
    per_prefill_token_s: float
    per_prefill_attention_s: float
    weight_bytes: int
    kv_bytes_per_token: int
    load_s: float
    reload_s: float
    embedding: bool = False  # an encoder: prompts only, no decode

    def prompt_s(self, start: int, tokens: int) -> float:
        """Computing prompt tokens [start, start + tokens) of a sequence, less the step's fixed cost."""
        pairs = attended_pairs(start, tokens)
        return tokens * self.per_prefill_token_s + pairs * self.per_prefill_attention_s


@dataclass(frozen=True)
class ThermalProfile:
    """First-order thermal and power model of one GPU (sim/thermal.py)."""

    idle_w: float
    tdp_w: float
    decode_power_fraction: float  # of the dynamic range, while only decodes run (memory-bound)
    thermal_resistance_c_per_w: float  # die above inlet per watt, steady state, healthy cooling
    time_constant_s: float
    slowdown_c: float  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    shutdown_c: float  # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
    hw_slowdown_margin_c: float  # past slowdown by this much, the hardware brake engages too
    min_clock_factor: float  # deepest cut the driver makes
    max_sm_clock_mhz: float


@dataclass(frozen=True)
class GpuProfile:
    name: str
    memory_bytes: int
    token_budget: int  # prompt + decode tokens one step may carry (chunked prefill)
    max_running: int  # sequences one engine runs at once
    preempt_granularity_s: float  # how long a latency-class prompt waits for a running step to yield
    models: dict[str, ModelCost] = field(default_factory=dict)
    thermal: ThermalProfile | None = None
    # The decoder's layers, where known: then a latency-class prompt waits half a layer of the step that
    # is running (its time / layers / 2: the engine's preemption points sit between layers) instead of
    # preempt_granularity_s, which is half a layer of a full-budget prompt step.
    layers: int | None = None
    # The worker's adaptive step budget (None: every prompt step takes the whole token_budget): a prompt
    # step carries the prompt tokens that give the best predicted tokens/s, and while latency work is in
    # play the fewest that keep this share of that best (the policy's itl_min_efficiency, the inter-token
    # target itself being out of reach on the profile), never cutting the top latency level's own tokens.
    itl_min_efficiency: float | None = None
    # How long an encoder request waits for a busy decoder to let it run; None: preempt_granularity_s
    # (on a GPU the encoder's kernels queue behind the decoder's up to a layer boundary).
    encoder_wait_s: float | None = None
    # The share of the compute an encoder request gets while the decoder is busy. 1.0: it runs alone and
    # the decoder waits for it (a GPU queues their kernels). A CPU worker's encoder is a thread beside
    # the decoder's on the same core, which the OS shares between them: at 0.5 an embedding takes twice
    # its encode while the decoder works, and the decoder loses its encode's worth either way.
    encoder_core_share: float = 1.0
    # Every step of every engine in the simulation slows by this factor per request in flight, for a
    # mesh whose processes share a host's cores (the CPU mesh: sim/host_contention.py); 0 for GPUs,
    # whose steps do not run on the cores that stream their tokens.
    host_slowdown_per_request: float = 0.0
    # The worker's admission rule (scheduler.py, _admit): a prompt is admitted when its KV, plus this
    # many tokens of expected output (or its whole output if shorter), plus the watermark's share of the
    # pool and, for batch, the latency reserve's share, is free; batch also leaves the reserve's share
    # of the seats. KV then grows a token per decode, and when it runs out the lowest-ranked sequence
    # is preempted (recomputed later).
    # KV block size: a prefix hit counts whole blocks only (prefix_cache.usable_hit). 16 is the worker's
    # default (services/worker/engine/config.py) and vLLM's.
    block_tokens: int = 16
    expected_output_tokens: int = _POLICY.expected_output_tokens
    latency_reserve: float = _POLICY.latency_reserve
    kv_watermark: float = SchedulerConfig.watermark

    @property
    def encoder_wait(self) -> float:
        return self.preempt_granularity_s if self.encoder_wait_s is None else self.encoder_wait_s

    def model(self, name: str) -> ModelCost:
        return self.models[name]


# --- H200 SXM, for fleet runs -----------------------------------------------------------------------
# NVIDIA H200 datasheet: 141 GB HBM3e at 4.8 TB/s, 989 TFLOP/s dense BF16 / 1,979 dense FP8, up to
# 700 W. Serving efficiency: decode streams weights at ~80% of peak bandwidth and prefill reaches ~50%
# of dense FP8 peak (vLLM and TensorRT-LLM on Hopper report 40-60% MFU for long prompts).
_H200_BW = 4.8e12 * 0.8
_H200_FP8 = 1979e12 * 0.5
_LAUNCH_S = 0.004  # per step: scheduling, sampling, kernel launches (vLLM's CPU overhead at batch 64)


def _roofline(
    name: str, params: float, layers: int, heads: int, kv_heads: int, head_dim: int, bytes_per_param: float
) -> ModelCost:
    """A decoder's step coefficients on an H200 from its size (FP8 weights and KV cache)."""
    weight_bytes = int(params * bytes_per_param)
    kv_bytes = 2 * layers * kv_heads * head_dim  # K and V, one byte each in FP8
    flops_per_token = 2 * params
    return ModelCost(
        name=name,
        base_s=_LAUNCH_S + weight_bytes / _H200_BW,
        per_row_s=flops_per_token / _H200_FP8,
        per_context_token_s=kv_bytes / _H200_BW,
        per_prefill_token_s=flops_per_token / _H200_FP8,
        # Attention over the context: 4 x layers x heads x head_dim FLOPs per query-key pair, counted as
        # this project's worker computes them (ModelCost.prompt_s); a GPU kernel that also skips the
        # diagonal block of a continued chunk does n x n / 2 fewer, a small share of a long context's.
        per_prefill_attention_s=4 * layers * heads * head_dim / _H200_FP8,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_bytes,
        # Loads: from local NVMe at ~5 GB/s; from a pinned host copy over PCIe Gen5 at ~50 GB/s.
        load_s=weight_bytes / 5e9,
        reload_s=weight_bytes / 50e9,
    )


H200 = GpuProfile(
    name="h200",
    memory_bytes=141 * 10**9,
    token_budget=2048,  # vLLM's default max_num_batched_tokens with chunked prefill
    max_running=256,
    preempt_granularity_s=0.002,  # half a layer of a 2048-token step on a 70B model
    models={
        # Llama-3.1-70B in FP8: 80 layers, 64 query and 8 KV heads of 128.
        "llama-70b": _roofline("llama-70b", 70.6e9, 80, 64, 8, 128, 1.0),
        # Llama-3.1-8B in BF16: 32 layers, 32 query and 8 KV heads of 128 (KV in FP8 as the 70B's).
        "llama-8b": _roofline("llama-8b", 8.0e9, 32, 32, 8, 128, 2.0),
        # all-MiniLM-L6-v2: 22M parameters, a few microseconds of compute per token.
        "minilm": ModelCost(
            name="minilm",
            base_s=0.0005,
            per_row_s=0.0,
            per_context_token_s=0.0,
            per_prefill_token_s=2 * 22e6 / _H200_FP8,
            per_prefill_attention_s=0.0,
            weight_bytes=90 * 10**6,
            kv_bytes_per_token=0,
            load_s=0.05,
            reload_s=0.01,
            embedding=True,
        ),
    },
    thermal=ThermalProfile(
        idle_w=75.0,  # nvidia-smi on an idle H100/H200 SXM: 65-90 W
        tdp_w=700.0,  # datasheet maximum
        # Splitwise (Patel et al., ISCA 2024): the prompt phase runs at the power cap, the token phase
        # well below it (about 60-70% of TDP on H100 for large batches).
        decode_power_fraction=0.6,
        # Chosen so a healthy GPU at full load and a 25 C inlet settles about 72 C, the middle of the
        # 65-75 C operators report for air-cooled HGX H100/H200 under sustained load.
        thermal_resistance_c_per_w=0.067,
        # Die + heatsink: GPU temperature follows a load step over minutes (TAPAS, Stojkovic et al.,
        # ASPLOS 2025, report temperatures settling minutes after load changes).
        time_constant_s=120.0,
        slowdown_c=87.0,  # H100/H200 SXM report about 87-90 C; the placer's default is 87 C
        shutdown_c=92.0,
        hw_slowdown_margin_c=3.0,
        min_clock_factor=0.5,  # HW slowdown halves clocks or more (NVML's description)
        max_sm_clock_mhz=1980.0,  # H200 boost clock
    ),
)
