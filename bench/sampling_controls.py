"""What the logit controls cost a decode step: the real SmolLM2 engine at batch 32, with no controls and
with penalties (repetition, frequency, presence), min_p and a logit_bias on every row, greedy and
sampled, and with a JSON schema on half the rows, measured interleaved in one run; then steps while a
new wide schema compiles on another thread; prints one JSON line on stdout, progress on stderr.

    .venv/bin/python bench/sampling_controls.py [--quick] [--rounds N]

Each round measures every configuration once (decode steps of 32 sequences of ~256 tokens; the median
step), the order rotated every round; reported are the medians over rounds and each configuration's
cost against its own baseline (greedy or sampled, no controls). Issue 18's bars: penalties (with
logprobs, not built yet) <= 15% of a step, a schema on half the rows <= 25%, and no step waits on a
compiling grammar.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

# Run as a script, Python put bench/ (not the repo root) on sys.path; `bench` and `services` live in the root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.progress import log
from services.common.sampling import SamplingParams
from services.common.structured import StructuredOutput, StructureKind
from services.worker.engine import LLM
from services.worker.engine.grammar import COMPILE_EXECUTOR
from services.worker.engine.profiling import measure_decode_step
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
    # A JSON schema on every other row (issue 18's "half the rows").
    "greedy_schema_half": lambda i: SamplingParams(
        temperature=0.0, structured=SCHEMA if i % 2 == 0 else None
    ),
}
# 32 sequences of ~350 tokens at 46 KiB a token (30 layers x 3 KV heads x 64 dims x K+V x 4 bytes).
KV_CACHE_BYTES = 1 << 30
BASELINE = {"greedy_controls": "greedy", "sampled_controls": "sampled", "greedy_schema_half": "greedy"}
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
                **while_compiling,
                "targets_met": {
                    "penalties<=0.15": all(cost[n] <= 0.15 for n in ("greedy_controls", "sampled_controls")),
                    "schema_half<=0.25": cost["greedy_schema_half"] <= 0.25,
                },
            }
        )
    )


def _steps_while_compiling(llm: LLM, steps: int) -> dict[str, object]:
    """Decode steps (greedy, batch 32) timed while another thread keeps compiling new wide schemas (each
    one new to the cache), as AsyncLLM does for requests that bring them, against the same steps with
    nothing compiling."""
    seconds: list[float] = []
    stop = threading.Event()

    def compile_new_schemas() -> None:
        while not stop.is_set():
            schema = {**WIDE, "title": f"wide {len(seconds)}"}  # a new spec: no cache hit
            start = time.perf_counter()
            llm.engine.grammars.compile(
                SamplingParams(structured=StructuredOutput(StructureKind.JSON_SCHEMA, json.dumps(schema)))
            )
            seconds.append(time.perf_counter() - start)

    quiet = measure_decode_step(llm, batch_size=32, context_len=256, steps=steps).step_ms
    compiling = COMPILE_EXECUTOR.submit(compile_new_schemas)  # where AsyncLLM compiles
    try:
        during = measure_decode_step(llm, batch_size=32, context_len=256, steps=steps).step_ms
    finally:
        stop.set()
        compiling.result()
    log(f"steps while schemas compile: {during:.1f} ms (quiet {quiet:.1f}); {len(seconds)} compiled")
    return {"step_ms_quiet": round(quiet, 2), "step_ms_while_compiling": round(during, 2),
            "schemas_compiled_meanwhile": len(seconds),
            "wide_schema_compile_s_median": round(statistics.median(seconds), 3)}  # fmt: skip


if __name__ == "__main__":
    main()
