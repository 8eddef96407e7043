"""The seeded benchmark workload: random prompts and per-request output lengths, and what a run returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WorkloadSpec:
    """Shape of a workload; lengths are inclusive (low, high) token counts drawn uniformly."""

    name: str
    num_requests: int
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    seed: int = 0


FULL = WorkloadSpec("full", 64, (16, 512), (16, 256))
QUICK = WorkloadSpec("quick", 24, (16, 256), (16, 96))
# Only used to warm every contender up once (kernels, allocator, caches); never timed.
WARMUP = WorkloadSpec("warmup", 4, (8, 48), (4, 12), seed=1)

# Ids below this are left out of prompts so no prompt holds pad/bos/eos (0, 1, 2 in Llama vocabularies).
FIRST_PROMPT_TOKEN_ID = 3


@dataclass(frozen=True)
class Workload:
    """Concrete requests, all submitted at t=0: prompt token ids and exact output lengths (EOS ignored)."""

    spec: WorkloadSpec
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    def summary(self) -> dict[str, object]:
        """JSON-ready description of what ran, so results from different workloads are never confused."""
        return {
            "name": self.spec.name,
            "requests": len(self.prompts),
            "prompt_len_range": list(self.spec.prompt_len),
            "output_len_range": list(self.spec.output_len),
            "seed": self.spec.seed,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }


def make_workload(spec: WorkloadSpec, vocab_size: int) -> Workload:
    """Deterministic in (spec, vocab_size): ids in [3, vocab_size), lengths uniform in the spec's ranges."""
    # A private generator: the global torch RNG state (used by models and other contenders) stays untouched.
    gen = torch.Generator().manual_seed(spec.seed)
    prompt_lens = torch.randint(
        spec.prompt_len[0], spec.prompt_len[1] + 1, (spec.num_requests,), generator=gen
    )
    output_lens = torch.randint(
        spec.output_len[0], spec.output_len[1] + 1, (spec.num_requests,), generator=gen
    )
    prompts = [
        torch.randint(FIRST_PROMPT_TOKEN_ID, vocab_size, (int(n),), generator=gen).tolist()
        for n in prompt_lens
    ]
    return Workload(spec=spec, prompts=prompts, output_lens=[int(n) for n in output_lens])


@dataclass(frozen=True)
class RunResult:
    """One timed pass of a contender over a workload. `tok_s` counts only each request's requested output."""

    wall_s: float
    output_tokens: int
    # Requests whose generated length differed from the requested one; a correct run has none.
    length_mismatches: int = 0
    # Generated ids per request in workload order, kept only to compare contenders; None when not collected.
    token_ids: list[list[int]] | None = None

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s
