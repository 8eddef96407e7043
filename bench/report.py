"""Turns per-round results into the benchmark's one JSON line: medians, speedups, MFU, raw rounds."""

from __future__ import annotations

import statistics

from bench.workload import RunResult


def median_tok_s(runs: list[RunResult]) -> float | None:
    """Median throughput over rounds; None when the contender did not run."""
    return statistics.median(r.tok_s for r in runs) if runs else None


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either side is missing."""
    return None if num is None or den is None or den == 0 else num / den


def paired_speedups(runs: dict[str, list[RunResult]], name: str, baseline: str) -> list[float] | None:
    """Per-round tok/s ratio name/baseline: both ran in the same round, so shared load mostly cancels."""
    if not runs.get(name) or not runs.get(baseline):
        return None
    return [round(a.tok_s / b.tok_s, 3) for a, b in zip(runs[name], runs[baseline], strict=True)]


def raw_rounds(runs: dict[str, list[RunResult]]) -> dict[str, list[dict[str, float]]]:
    """Every timed round of every contender, so a median can be checked against its spread."""
    return {
        name: [{"tok_s": round(r.tok_s, 2), "wall_s": round(r.wall_s, 4)} for r in results]
        for name, results in runs.items()
    }


def greedy_agreement(a: RunResult | None, b: RunResult | None) -> float | None:
    """Mean over requests of the fraction of output tokens before the first disagreement, in [0, 1].

    Informational: a random fp32 model has near-tied logits, so batching and kernel order alone can flip an
    argmax; near 1 says two contenders compute the same model, near 0 says one of them does not.
    """
    if a is None or b is None or a.token_ids is None or b.token_ids is None:
        return None
    fractions = []
    for x, y in zip(a.token_ids, b.token_ids, strict=True):
        same = 0
        for tx, ty in zip(x, y, strict=False):
            if tx != ty:
                break
            same += 1
        fractions.append(same / max(len(x), len(y), 1))
    return sum(fractions) / len(fractions)
