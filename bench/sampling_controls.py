"""What the generation controls cost a decode step: the real SmolLM2 engine at batch 32, with no controls,
with penalties (repetition, frequency, presence), min_p and a logit_bias on every row, with those and
logprobs (20 alternatives) on every row, greedy and sampled, and with a JSON schema on half the rows,
measured interleaved in one run; what the sampler's checks cost rows that use no control; then the
step-time series while a new wide schema compiles on another thread; prints one JSON line on stdout,
progress on stderr.

    .venv/bin/python bench/sampling_controls.py [--quick] [--rounds N]

Each round measures every configuration once (decode steps of 32 sequences of ~256 tokens; the median
step), the order rotated every round; reported are the medians over rounds and each configuration's
cost against its own baseline (greedy or sampled, no controls). Issue 18's bars: unused controls <= 2%
of a step, penalties + logprobs <= 15%, a schema on half the rows <= 25%, and no step waits on a
compiling grammar.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Run as a script, Python put bench/ (not the repo root) on sys.path; `bench` and `services` live in the root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.progress import log
from services.common.sampling import MAX_LOGPROBS, SamplingParams
from services.common.structured import StructuredOutput, StructureKind
from services.worker.engine import LLM
from services.worker.engine.grammar import COMPILE_EXECUTOR
from services.worker.engine.profiling import measure_decode_step
from services.worker.engine.sequence import Sequence
from services.worker.models.catalog import resolve_model_source

CONTROLS = {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1, "min_p": 0.05}
BIAS = {token: 1.0 for token in range(0, 2000, 50)}  # 40 tokens nudged on every row
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["name", "age", "tags"],
}
SCHEMA = StructuredOutput(StructureKind.JSON_SCHEMA, json.dumps(PERSON))
CONFIGS: dict[str, Callable[[int], SamplingParams]] = {
    "greedy": lambda i: SamplingParams(temperature=0.0),
    "greedy_controls": lambda i: SamplingParams(temperature=0.0, logit_bias=BIAS, **CONTROLS),
    "sampled": lambda i: SamplingParams(temperature=0.8, top_p=0.95, seed=i),
    "sampled_controls": lambda i: SamplingParams(
        temperature=0.8, top_p=0.95, seed=i, logit_bias=BIAS, **CONTROLS
    ),
    "greedy_controls_logprobs": lambda i: SamplingParams(
        temperature=0.0, logit_bias=BIAS, logprobs=MAX_LOGPROBS, **CONTROLS
    ),
    "sampled_controls_logprobs": lambda i: SamplingParams(
        temperature=0.8, top_p=0.95, seed=i, logit_bias=BIAS, logprobs=MAX_LOGPROBS, **CONTROLS
    ),
    # A JSON schema on every other row (issue 18's "half the rows").
    "greedy_schema_half": lambda i: SamplingParams(
        temperature=0.0, structured=SCHEMA if i % 2 == 0 else None
    ),
}
# 32 sequences of ~350 tokens at 46 KiB a token (30 layers x 3 KV heads x 64 dims x K+V x 4 bytes).
KV_CACHE_BYTES = 1 << 30
BASELINE = {
    "greedy_controls": "greedy",
    "sampled_controls": "sampled",
    "greedy_controls_logprobs": "greedy",
    "sampled_controls_logprobs": "sampled",
    "greedy_schema_half": "greedy",
}
PENALISED = ("greedy_controls", "sampled_controls", "greedy_controls_logprobs", "sampled_controls_logprobs")
# A schema this wide takes the compiler a while: steps go on meanwhile (it compiles on another thread).
WIDE = {
    "type": "object",
    "properties": {f"field_{k}": {"type": ["string", "integer", "null"]} for k in range(400)},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds: about a minute")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5, quick 2)")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    steps = 8 if args.quick else 20
    # fifo: every sequence admitted at once (the adaptive policy holds seats back for latency classes).
    llm = LLM(resolve_model_source("smollm2"), max_num_seqs=32, kv_cache_bytes=KV_CACHE_BYTES, policy="fifo")
    names = list(CONFIGS)
    measure_decode_step(llm, batch_size=32, context_len=256, steps=4)  # warm-up
    steps_ms: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            timing = measure_decode_step(
                llm, batch_size=32, context_len=256, steps=steps, params=CONFIGS[name]
            )
            steps_ms[name].append(timing.step_ms)
            log(f"round {r + 1}/{rounds} {name}: step {timing.step_ms:.1f} ms")
    median = {name: round(statistics.median(values), 2) for name, values in steps_ms.items()}
    cost = {name: round(median[name] / median[base] - 1, 3) for name, base in BASELINE.items()}
    unused = _unused_controls_us(llm)
    unused_cost = round(unused["sampler_overhead_us"] / (median["greedy"] * 1e3), 5)
    while_compiling = _steps_while_compiling(llm, steps)
    print(
        json.dumps(
            {
                "bench": "sampling_controls",
                "model": "SmolLM2-135M-Instruct",
                "batch_size": 32,
                "context_len": 256,
                "rounds": rounds,
                "step_ms": median,
                "step_ms_by_round": steps_ms,
                "controls_cost": cost,
                **unused,
                "unused_controls_cost": unused_cost,
                **while_compiling,
                "targets_met": {
                    "unused<=0.02": unused_cost <= 0.02,
                    "penalties_logprobs<=0.15": all(cost[n] <= 0.15 for n in PENALISED),
                    "schema_half<=0.25": cost["greedy_schema_half"] <= 0.25,
                    "no_step_waits_on_compile": while_compiling["step_ms_max_while_compiling"]
                    <= 2 * while_compiling["step_ms_quiet"],
                },
            }
        )
    )


def _unused_controls_us(llm: LLM, repeats: int = 300) -> dict[str, float]:
    """What Sampler.sample costs 32 greedy rows that ask for no control, over the bare greedy choice it
    reduces to (one max over the logits and the list of ids), in microseconds, medians of repeats: the
    price every step pays for the controls being there."""
    sampler = llm.engine.runner.sampler
    vocab = llm.engine.model_config.vocab_size
    logits = torch.randn(32, vocab, generator=torch.Generator().manual_seed(0))
    seqs = [Sequence(f"u{i}", [1, 2, 3], SamplingParams(temperature=0.0)) for i in range(32)]
    with_checks, bare = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        sampler.sample(logits, seqs)
        with_checks.append(time.perf_counter() - start)
        start = time.perf_counter()
        logits.max(dim=-1).indices.tolist()
        bare.append(time.perf_counter() - start)
    sample_us, bare_us = statistics.median(with_checks) * 1e6, statistics.median(bare) * 1e6
    return {"sampler_greedy_us": round(sample_us, 1), "bare_greedy_us": round(bare_us, 1),
            "sampler_overhead_us": round(max(0.0, sample_us - bare_us), 1)}  # fmt: skip


def _steps_while_compiling(llm: LLM, steps: int) -> dict[str, object]:
    """The step-time series (greedy, batch 32) while another thread compiles one new wide schema, as
    AsyncLLM does for a request that brings it, against the same steps with nothing compiling: each
    step's time, and whether it ended while the compile ran."""
    quiet = measure_decode_step(llm, batch_size=32, context_len=256, steps=steps).step_ms
    schema = {**WIDE, "title": f"wide {time.time_ns()}"}  # a new spec: no cache hit
    params = SamplingParams(structured=StructuredOutput(StructureKind.JSON_SCHEMA, json.dumps(schema)))
    span: list[float] = []

    def compile_one() -> None:
        span.append(time.perf_counter())
        llm.engine.grammars.compile(params)
        span.append(time.perf_counter())

    compiling = COMPILE_EXECUTOR.submit(compile_one)  # where AsyncLLM compiles
    series = measure_decode_step(llm, batch_size=32, context_len=256, steps=steps * 3)
    compiling.result()
    started, ended = span
    during = [ms for ms, end in zip(series.steps_ms, series.step_ends, strict=True) if started < end <= ended]
    longest = max(during, default=0.0)
    log(f"steps while a schema compiles: max {longest:.1f} ms over {len(during)} (quiet {quiet:.1f})")
    return {"step_ms_quiet": round(quiet, 2),
            "step_ms_median_while_compiling": round(statistics.median(during), 2) if during else None,
            "step_ms_max_while_compiling": round(max(during), 2) if during else 0.0,
            "steps_while_compiling": len(during),
            "wide_schema_compile_s": round(ended - started, 3),
            "step_ms_series": [round(ms, 1) for ms in series.steps_ms],
            "step_series_compiling": [started < end <= ended for end in series.step_ends]}  # fmt: skip


if __name__ == "__main__":
    main()
