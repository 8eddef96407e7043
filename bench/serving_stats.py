"""Summaries for bench/serving.py, as benchmark_serving reports them: per load, throughput over the run's
span and TTFT / TPOT / ITL / e2e percentiles; then the headline figures and ratios between servers."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence

from bench.mesh_stats import percentile_ms
from bench.serving_client import RequestRecord, RunResult
from bench.serving_data import ChatRequest

# What the run is for (recorded, not asserted: a 2-core CPU box is noisy, the reader judges).
TARGETS = {"out_tok_s_vs_vllm": ">= 1.5", "ttft_p99_vs_vllm": "<= 0.5", "grpc_vs_http": ">= 0.95"}


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, None when either is missing. (bench.report has one too, but importing it loads torch
    into the client process, which competes with the server for the 2 cores.)"""
    return None if num is None or den is None or den == 0 else num / den


def _pcts(name: str, values_s: Sequence[float]) -> dict[str, float | None]:
    if not values_s:
        return {f"{name}_ms_p50": None, f"{name}_ms_p99": None, f"{name}_ms_mean": None}
    return {
        f"{name}_ms_p50": round(percentile_ms(values_s, 50), 2),
        f"{name}_ms_p99": round(percentile_ms(values_s, 99), 2),
        f"{name}_ms_mean": round(sum(values_s) / len(values_s) * 1e3, 2),
    }


def tpot_s(rec: RequestRecord) -> float | None:
    """Time per output token after the first, as benchmark_serving defines it: (e2e - TTFT) / (n - 1)."""
    ttft, e2e, n = rec.ttft_s, rec.e2e_s, rec.output_tokens
    if ttft is None or e2e is None or not n or n < 2:
        return None
    return (e2e - ttft) / (n - 1)


def run_summary(result: RunResult, requests: Sequence[ChatRequest]) -> dict[str, object]:
    """One load's report. Throughput counts the output tokens (the server's usage) of completed requests
    over the span from the first send to the last stream's end."""
    done = [r for r in result.records if r.ok]
    failed = [r for r in result.records if not r.ok]
    out_tokens = sum(r.output_tokens or 0 for r in done)
    expected_prompt = {q.index: q.prompt_tokens for q in requests}
    errors = Counter((r.error or "incomplete")[:120] for r in failed)
    return {
        "rate": "inf" if result.rate == float("inf") else result.rate,
        "requests": len(result.records),
        "completed": len(done),
        "errors": len(failed),
        "error_kinds": dict(errors.most_common(3)),
        # ignore_eos makes the length exact, so any other count means the server stopped early or ran on.
        "wrong_token_counts": sum(r.output_tokens != r.max_tokens for r in done),
        # Informational: a server templating the messages differently would be running other prompts.
        "prompt_token_mismatches": sum(
            r.prompt_tokens is not None and r.prompt_tokens != expected_prompt[r.index] for r in done
        ),
        "timed_out": result.timed_out,
        "duration_s": round(result.duration_s, 3),
        "client_cpu_s": round(result.client_cpu_s, 2),
        "output_tokens": out_tokens,
        "out_tok_s": round(out_tokens / result.duration_s, 2) if result.duration_s > 0 else None,
        "requests_s": round(len(done) / result.duration_s, 3) if result.duration_s > 0 else None,
        **_pcts("ttft", [t for r in done if (t := r.ttft_s) is not None]),
        **_pcts("tpot", [t for r in done if (t := tpot_s(r)) is not None]),
        **_pcts("itl", [b - a for r in done for a, b in itertools.pairwise(r.chunk_times)]),
        **_pcts("e2e", [t for r in done if (t := r.e2e_s) is not None]),
    }


def rate_key(rate: float) -> str:
    return "inf" if rate == float("inf") else f"{rate:g}"


def headline(
    prefix: str, runs: Mapping[str, Mapping[str, object]], moderate: str | None
) -> dict[str, object]:
    """`{prefix}_out_tok_s` at saturation and `{prefix}_ttft_ms_p99` at the moderate rate (None when that
    load did not run)."""
    inf = runs.get("inf", {})
    mod = runs.get(moderate, {}) if moderate else {}
    return {f"{prefix}_out_tok_s": inf.get("out_tok_s"), f"{prefix}_ttft_ms_p99": mod.get("ttft_ms_p99")}


def comparisons(report: Mapping[str, object]) -> dict[str, object]:
    """The ratios the targets are stated in, from the headline figures already in report."""

    def num(key: str) -> float | None:
        value = report.get(key)
        return float(value) if isinstance(value, (int, float)) else None

    out = {
        "out_tok_s_vs_vllm": ratio(num("mesh_out_tok_s"), num("vllm_out_tok_s")),
        "ttft_p99_vs_vllm": ratio(num("mesh_ttft_ms_p99"), num("vllm_ttft_ms_p99")),
        "grpc_vs_http": ratio(num("grpc_out_tok_s"), num("mesh_out_tok_s")),
    }
    return {k: None if v is None else round(v, 3) for k, v in out.items()}
