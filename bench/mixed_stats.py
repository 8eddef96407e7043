"""Summaries for bench/mixed.py: per-class latency percentiles, batch throughput, the budget histogram, and
where real-time TTFT goes (waiting out the step in flight, queueing, its own step)."""

from __future__ import annotations

import bisect
import statistics
from collections import Counter
from collections.abc import Sequence

import numpy as np

from bench.mixed_driver import RequestTiming, RunRecord, StepRecord
from bench.mixed_trace import CLASS_NAMES
from bench.report import ratio
from services.common.workload import WorkloadClass

LATENCY_HEAVY_TOKENS = 128


def pct_ms(values_s: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100, linear interpolation) of values in seconds, in ms; None when empty."""
    return float(np.percentile(np.asarray(values_s), q)) * 1e3 if values_s else None


def _pcts(name: str, values_s: Sequence[float]) -> dict[str, float | None]:
    return {f"{name}_ms_p50": pct_ms(values_s, 50), f"{name}_ms_p99": pct_ms(values_s, 99)}


def of_class(timings: list[RequestTiming], workload: WorkloadClass) -> list[RequestTiming]:
    return [t for t in timings if t.request.workload is workload]


def ttfts(timings: list[RequestTiming]) -> list[float]:
    """TTFT seconds of the requests that got a first token."""
    return [s for t in timings if (s := t.ttft_s) is not None]


def class_summary(timings: list[RequestTiming]) -> dict[str, object]:
    """Counts and TTFT / e2e / inter-token percentiles (ms) of one class's requests."""
    itls = [b - a for t in timings for a, b in zip(t.token_times, t.token_times[1:], strict=False)]
    done = [t for t in timings if t.finished is not None and not t.refused]
    return {
        "requests": len(timings),
        "completed": len(done),
        "refused": sum(t.refused is not None for t in timings),
        "unfinished": sum(t.finished is None for t in timings),
        "wrong_length": sum(len(t.token_times) != t.request.max_tokens for t in done),
        **_pcts("ttft", ttfts(timings)),
        **_pcts("e2e", [s for t in timings if (s := t.e2e_s) is not None]),
        **_pcts("itl", itls),
    }


def batch_throughput(record: RunRecord) -> dict[str, object]:
    """Batch tokens (prompt + requested output) of finished batch requests per second, over the span from
    the first batch arrival to the last batch finish."""
    batch = of_class(record.requests, WorkloadClass.BATCH)
    done = [t for t in batch if t.finished is not None and not t.refused]
    if not done:
        return {"tok_s": None, "span_s": None, "finished": 0, "requests": len(batch)}
    span = max(t.finished for t in done if t.finished is not None) - min(t.arrival for t in batch)
    tokens = sum(t.request.tokens for t in done)
    tenants: Counter[str] = Counter()
    for t in done:
        tenants[t.request.tenant] += t.request.tokens
    return {
        "tok_s": tokens / span,
        "span_s": span,
        "tokens": tokens,
        "finished": len(done),
        "requests": len(batch),
        "tokens_by_tenant": dict(sorted(tenants.items())),
    }


def budget_summary(steps_by_budget: Counter[int]) -> dict[str, object]:
    """The step-weighted median budget, the share of steps at the largest budget, and the histogram."""
    if not steps_by_budget:
        return {"median": None, "share_at_max": None, "histogram": {}}
    ordered = sorted(steps_by_budget.items())
    total = sum(steps_by_budget.values())
    seen = 0
    median = ordered[-1][0]
    for budget, count in ordered:
        seen += count
        if 2 * seen >= total:
            median = budget
            break
    return {
        "median": median,
        "share_at_max": ordered[-1][1] / total,
        "histogram": {str(b): c for b, c in ordered},
    }


def step_summary(steps: list[StepRecord]) -> dict[str, object]:
    """Step durations and sizes, and how well the policy's step-time model predicted them.

    overhead = step wall time - the runner's time (scheduling, output building: the part the policy's
    step-time model does not see); model_over_predicted = runner time / the model's estimate for the shape;
    by_tokens: tokens/second of the steps in each token bucket (powers of two), wall time;
    latency_heavy_steps: steps carrying >= LATENCY_HEAVY_TOKENS real-time/agent tokens (prefills the
    budget may not cut), which every request arriving meanwhile waits out.
    """
    walls = [s.end - s.start for s in steps]
    buckets: dict[int, list[StepRecord]] = {}
    for step in steps:
        buckets.setdefault(1 << max(0, step.tokens - 1).bit_length(), []).append(step)
    heavy = [s for s in steps if s.batch.latency_tokens >= LATENCY_HEAVY_TOKENS]
    return {
        "steps": len(steps),
        **_pcts("step", walls),
        "tokens_p50": _pct([s.tokens for s in steps], 50),
        "tokens_p99": _pct([s.tokens for s in steps], 99),
        **_pcts("overhead", [w - s.batch.model_s for s, w in zip(steps, walls, strict=True)]),
        "model_over_predicted_p50": _pct(_prediction_ratios(steps), 50),
        "model_over_predicted_p99": _pct(_prediction_ratios(steps), 99),
        "by_tokens": {
            str(bucket): {
                "steps": len(group),
                "tok_s": sum(s.tokens for s in group) / sum(s.end - s.start for s in group),
                **_pcts("step", [s.end - s.start for s in group]),
            }
            for bucket, group in sorted(buckets.items())
        },
        "latency_heavy_steps": {
            "steps": len(heavy),
            **_pcts("step", [s.end - s.start for s in heavy]),
            "latency_tokens_p50": _pct([s.batch.latency_tokens for s in heavy], 50),
        },
    }


def _prediction_ratios(steps: list[StepRecord]) -> list[float]:
    return [s.batch.model_s / s.batch.predicted_s for s in steps if s.batch.predicted_s]


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None


def ttft_breakdown(timings: list[RequestTiming], steps: list[StepRecord]) -> dict[str, object]:
    """Where the TTFT of these requests went, as p50/p99 of each part (they add up to the TTFT):
    inflight = arrival until the driver added it (waiting out the step running when it arrived),
    queued = added until first scheduled (steps_skipped counts the steps it sat out), prefill = first
    scheduled until its first token (its own step, or `chunks` steps if its prompt was split). Also the
    step in flight at arrival and the first-token step (ms, tokens, budget), and the three worst TTFTs."""
    starts = [s.start for s in steps]
    ends = [s.end for s in steps]
    rows = []
    for t in timings:
        if t.added is None or t.first_scheduled is None or not t.token_times:
            continue
        first = t.token_times[0]
        at_arrival = bisect.bisect_right(starts, t.arrival) - 1
        inflight = steps[at_arrival] if at_arrival >= 0 and ends[at_arrival] > t.arrival else None
        add_idx = bisect.bisect_left(starts, t.added)
        sched_idx = bisect.bisect_right(starts, t.first_scheduled) - 1
        token_idx = bisect.bisect_left(ends, first)
        own = steps[token_idx]
        rows.append(
            {
                "ttft_ms": (first - t.arrival) * 1e3,
                "inflight_ms": (t.added - t.arrival) * 1e3,
                "queued_ms": (t.first_scheduled - t.added) * 1e3,
                "prefill_ms": (first - t.first_scheduled) * 1e3,
                "steps_skipped": max(0, sched_idx - add_idx),
                "chunks": token_idx - sched_idx + 1,
                "prompt_len": len(t.request.prompt),
                "inflight_step_ms": (inflight.end - inflight.start) * 1e3 if inflight else 0.0,
                "inflight_step_tokens": inflight.tokens if inflight else 0,
                "inflight_step_budget": inflight.budget if inflight else 0,
                "inflight_step_latency_tokens": inflight.batch.latency_tokens if inflight else 0,
                "own_step_ms": (own.end - own.start) * 1e3,
                "own_step_tokens": own.tokens,
                "own_step_budget": own.budget,
                "own_step_latency_tokens": own.batch.latency_tokens,
            }
        )
    if not rows:
        return {}
    out: dict[str, object] = {}
    for key in rows[0]:
        if key in ("ttft_ms", "prompt_len"):
            continue
        values = [r[key] for r in rows]
        out[f"{key}_p50"] = _pct(values, 50)
        out[f"{key}_p99"] = _pct(values, 99)
    out["not_scheduled_in_first_step"] = sum(r["steps_skipped"] > 0 for r in rows)
    out["worst"] = sorted(rows, key=lambda r: r["ttft_ms"], reverse=True)[:3]
    return out


def batch_end(record: RunRecord) -> float:
    """When the last batch request finished (the run's end if one never did)."""
    finishes = [t.finished for t in of_class(record.requests, WorkloadClass.BATCH)]
    return record.end if not finishes or None in finishes else max(f for f in finishes if f is not None)


def latency_class_summary(
    workload: WorkloadClass, records: list[RunRecord], idle: dict[str, RequestTiming]
) -> dict[str, object]:
    """A latency class's numbers, pooled over rounds, over the requests that arrived while batch work was
    still in the engine (the rest met an engine with no batch left), with the idle TTFT p99 of those same
    requests and the ratio; `all_arrivals` keeps the whole class's headline numbers."""
    everything = [t for r in records for t in of_class(r.requests, workload)]
    loaded = [t for r in records for t in of_class(r.requests, workload) if t.arrival <= batch_end(r)]
    summary = class_summary(loaded)
    idle_p99 = pct_ms(ttfts([idle[t.request.request_id] for t in loaded]), 99)
    summary["idle_ttft_ms_p99"] = idle_p99
    summary["ttft_p99_ratio"] = ratio(pct_ms(ttfts(loaded), 99), idle_p99)
    summary["ttft_p99_ratio_per_round"] = [
        ratio(pct_ms(ttfts(mine), 99), pct_ms(ttfts([idle[t.request.request_id] for t in mine]), 99))
        for r in records
        if (mine := [t for t in of_class(r.requests, workload) if t.arrival <= batch_end(r)])
    ]
    whole = class_summary(everything)
    summary["all_arrivals"] = {
        k: whole[k] for k in ("requests", "ttft_ms_p50", "ttft_ms_p99", "e2e_ms_p50", "e2e_ms_p99")
    }
    # Rounds ran one after another, so the pooled steps stay in time order for the breakdown's search.
    summary["ttft_breakdown"] = ttft_breakdown(loaded, [s for r in records for s in r.steps])
    return summary


def policy_summary(records: list[RunRecord], idle: dict[str, RequestTiming]) -> dict[str, object]:
    """Everything the report says about one policy's runs of the trace (one per round, in time order);
    idle: the idle run by request id. Latency numbers are pooled over rounds; batch tok/s is the median
    of the rounds'."""
    classes = {}
    for workload, name in CLASS_NAMES.items():
        if workload is WorkloadClass.BATCH:
            classes[name] = class_summary([t for r in records for t in of_class(r.requests, workload)])
        else:
            classes[name] = latency_class_summary(workload, records, idle)
        classes[name]["preemptions"] = sum(r.preemptions_by_class[workload] for r in records)
    rounds = [batch_throughput(r) for r in records]
    rates = [x["tok_s"] for x in rounds if isinstance(x["tok_s"], float)]
    return {
        "classes": classes,
        "batch_tok_s": statistics.median(rates) if len(rates) == len(rounds) else None,
        "batch_throughput_per_round": rounds,
        # Latency requests kept arriving until the last batch finish: the whole batch span was mixed.
        "batch_span_covered": all(_span_covered(r) for r in records),
        "batch_all_finished": all(x["finished"] == x["requests"] for x in rounds),
        "budget": budget_summary(sum((r.steps_by_budget for r in records), Counter())),
        **step_summary([s for r in records for s in r.steps]),
        "wall_s_per_round": [r.end - r.start for r in records],
        "timed_out": any(r.timed_out for r in records),
    }


def _span_covered(record: RunRecord) -> bool:
    arrivals = [t.arrival for t in record.requests if t.request.workload is not WorkloadClass.BATCH]
    return bool(arrivals) and max(arrivals) >= batch_end(record)
