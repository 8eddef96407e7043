"""Machine peak (dense fp32 matmul FLOP/s) and the model FLOPs a workload costs, for MFU.

Workload FLOPs, per request with prompt length P and output length O (one multiply-add = 2 FLOPs):
    dense     = 2 * N_nonemb * (P + O)      every position goes through every non-embedding weight once
    lm_head   = 2 * V * H * O               logits are only needed for the O positions that sample a token
    attention = 4 * L * H * sum_{c=1}^{P+O} c
              = 2 * L * H * (P + O) * (P + O + 1)
                                            QK^T and AV each cost 2 * H * c at a position that sees c keys
N_nonemb excludes the input embedding and the LM head (a lookup and the term above). Counting P + O positions
(not P + O - 1) follows the usual convention; the difference is one decode position per request.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from bench.workload import Workload


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP formula needs from a checkpoint."""

    non_embedding_params: int
    vocab_size: int
    hidden_size: int
    num_layers: int


@dataclass(frozen=True)
class WorkloadFlops:
    dense: float
    lm_head: float
    attention: float

    @property
    def total(self) -> float:
        return self.dense + self.lm_head + self.attention


def model_shape(model: torch.nn.Module) -> ModelShape:
    """Shape of a loaded transformers causal LM; the embedding and LM head are not counted as dense."""
    config = model.config
    embedding_like = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    non_embedding = sum(p.numel() for p in model.parameters() if id(p) not in embedding_like)
    return ModelShape(
        non_embedding_params=non_embedding,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
    )


def workload_flops(shape: ModelShape, workload: Workload) -> WorkloadFlops:
    """Model FLOPs to serve `workload` once (formula in the module docstring); prefill and decode included."""
    dense = lm_head = attention = 0.0
    for prompt, out_len in zip(workload.prompts, workload.output_lens, strict=True):
        positions = len(prompt) + out_len
        dense += 2.0 * shape.non_embedding_params * positions
        lm_head += 2.0 * shape.vocab_size * shape.hidden_size * out_len
        attention += 2.0 * shape.num_layers * shape.hidden_size * positions * (positions + 1)
    return WorkloadFlops(dense=dense, lm_head=lm_head, attention=attention)


@dataclass(frozen=True)
class MatmulPeak:
    """Best median fp32 matmul rate over the sizes tried, plus each size's median, in GFLOP/s."""

    gflops: float
    per_size_gflops: dict[int, float]
    seconds: float


def measure_matmul_peak(sizes: tuple[int, ...] = (1024, 2048, 4096), repeats: int = 5) -> MatmulPeak:
    """Times torch.mm on square fp32 matrices at torch's default threads; median per size, best size wins."""
    start = time.perf_counter()
    per_size: dict[int, float] = {}
    for n in sizes:
        a = torch.randn(n, n, dtype=torch.float32)
        b = torch.randn(n, n, dtype=torch.float32)
        out = torch.empty(n, n, dtype=torch.float32)
        torch.mm(a, b, out=out)  # untimed: first call pays for thread pool start-up and page faults on `out`
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            times.append(time.perf_counter() - t0)
        per_size[n] = 2.0 * n**3 / statistics.median(times) / 1e9
    return MatmulPeak(
        gflops=max(per_size.values()), per_size_gflops=per_size, seconds=time.perf_counter() - start
    )
