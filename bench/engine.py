"""End-to-end throughput of our engine against transformers (static and continuous batching) and, optionally,
vLLM, on one seeded mixed workload in one process; prints one JSON line on stdout, progress on stderr.

    .venv/bin/python bench/engine.py [--quick] [--rounds N] [--vllm-python PATH] [--model-dir DIR]

Contenders run interleaved, one pass each per round (order rotated every round), and medians are reported,
because this machine's throughput drifts by tens of percent between identical runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Run as a script, Python put bench/ (not the repo root) on sys.path; `bench` and `services` live in the root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench import report
from bench.checkpoint import DEFAULT_MODEL_DIR, ensure_checkpoint
from bench.flops import measure_matmul_peak, model_shape, workload_flops
from bench.hf_baselines import HfContinuousBatching, load_hf_model, run_hf_static
from bench.our_engine import OurEngine
from bench.progress import log
from bench.workload import FULL, QUICK, WARMUP, RunResult, Workload, make_workload

Contender = Callable[[Workload], RunResult]

STATIC_BATCH_SIZE = 32
DECODE_PROBE = {"batch_size": 32, "context_len": 256, "steps": 20}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="24 short requests, one round: under two minutes"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="timed rounds per contender (default 3, quick 1)"
    )
    parser.add_argument(
        "--vllm-python", type=Path, default=None, help="interpreter of a venv with vLLM (CPU)"
    )
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--max-num-seqs", type=int, default=None, help="passed to our LLM when set")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None, help="passed to our LLM when set")
    parser.add_argument("--skip-engine", action="store_true", help="baselines only (our engine not timed)")
    args = parser.parse_args()
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def engine_kwargs(args: argparse.Namespace) -> dict[str, int]:
    """Only the LLM options given on the command line; the rest stay at the engine's defaults."""
    given = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}
    return {k: v for k, v in given.items() if v is not None}


def probe_decode(engine: OurEngine | None) -> tuple[float | None, float | None]:
    """(step ms, forward ms) at 32 decoding sequences; (None, None) when the engine was skipped."""
    if engine is None:
        return None, None
    step_ms, forward_ms = engine.decode_step(**DECODE_PROBE)
    log(f"decode step b32: {step_ms:.2f} ms, forward {forward_ms:.2f} ms")
    return step_ms, forward_ms


def run_rounds(
    contenders: dict[str, Contender], workload: Workload, rounds: int
) -> dict[str, list[RunResult]]:
    """Each round runs every contender once; the start rotates so no contender always follows the same one."""
    names = list(contenders)
    runs: dict[str, list[RunResult]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            result = contenders[name](workload)
            runs[name].append(result)
            log(f"round {r + 1}/{rounds} {name}: {result.tok_s:.1f} tok/s ({result.wall_s:.2f}s)")
            if result.length_mismatches:
                log(f"WARNING {name}: {result.length_mismatches} requests had the wrong output length")
    return runs


def main() -> None:
    args = parse_args()
    bench_start = time.perf_counter()
    load_start = list(os.getloadavg())
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    model_dir = ensure_checkpoint(args.model_dir)
    log(f"checkpoint {model_dir}, torch threads {torch.get_num_threads()}")

    # Separate instances: the continuous-batching manager swaps attention implementations and caches itself on
    # the model it is given.
    static_model = load_hf_model(model_dir)
    cb_model = load_hf_model(model_dir)
    shape = model_shape(static_model)
    workload = make_workload(QUICK if args.quick else FULL, shape.vocab_size)
    warmup = make_workload(WARMUP, shape.vocab_size)
    hf_cb = HfContinuousBatching(cb_model, sizing=workload)

    contenders: dict[str, Contender] = {
        "hf_static": lambda w: run_hf_static(static_model, w, STATIC_BATCH_SIZE),
        "hf_cb": hf_cb.run,
    }
    engine = None if args.skip_engine else OurEngine(model_dir, engine_kwargs(args))
    if engine is not None:
        contenders["engine"] = engine.run
    # Holds the workload file handed to the vLLM runner; removed just before the result is printed.
    scratch = tempfile.TemporaryDirectory(prefix="bench-engine-")
    if args.vllm_python is not None:
        from bench.vllm_client import VllmSubprocess

        contenders["vllm"] = VllmSubprocess(args.vllm_python, model_dir.resolve(), Path(scratch.name)).run

    for name, run in contenders.items():
        log(f"warm-up {name}")
        run(warmup)

    peak = measure_matmul_peak(sizes=(1024, 2048) if args.quick else (1024, 2048, 4096))
    log(f"matmul peak {peak.gflops:.1f} GFLOP/s {peak.per_size_gflops}")

    log(f"workload {workload.summary()}, {rounds} round(s)")
    runs = run_rounds(contenders, workload, rounds)

    step_ms, forward_ms = probe_decode(engine)

    flops = workload_flops(shape, workload)
    tok_s = {name: report.median_tok_s(r) for name, r in runs.items()}
    engine_tok_s = tok_s.get("engine")
    engine_wall = statistics.median(r.wall_s for r in runs["engine"]) if "engine" in runs else None
    last = {name: r[-1] for name, r in runs.items()}
    result = {
        "engine_tok_s": engine_tok_s,
        "hf_static_tok_s": tok_s["hf_static"],
        "hf_cb_tok_s": tok_s["hf_cb"],
        "speedup_vs_hf_static": report.ratio(engine_tok_s, tok_s["hf_static"]),
        "speedup_vs_hf_cb": report.ratio(engine_tok_s, tok_s["hf_cb"]),
        "decode_step_ms_b32": step_ms,
        "forward_ms_b32": forward_ms,
        "overhead_ratio": report.ratio(step_ms, forward_ms),
        "mfu": report.ratio(flops.total, engine_wall and engine_wall * peak.gflops * 1e9),
        "matmul_gflops": peak.gflops,
        "matmul_gflops_per_size": {str(k): v for k, v in peak.per_size_gflops.items()},
        "workload_gflops": {
            "dense": flops.dense / 1e9,
            "lm_head": flops.lm_head / 1e9,
            "attention": flops.attention / 1e9,
            "total": flops.total / 1e9,
        },
        "workload": workload.summary(),
        "rounds": rounds,
        "rounds_raw": report.raw_rounds(runs),
        "speedup_per_round": {
            baseline: report.paired_speedups(runs, "engine", baseline)
            for baseline in runs
            if baseline != "engine"
        },
        # Other jobs on this machine inflate every timing; the load average says when a run was contended.
        "loadavg_start_end": [load_start, list(os.getloadavg())],
        "length_mismatches": {name: sum(x.length_mismatches for x in r) for name, r in runs.items()},
        "greedy_agreement": {
            "engine_vs_hf_cb": report.greedy_agreement(last.get("engine"), last["hf_cb"]),
            "hf_static_vs_hf_cb": report.greedy_agreement(last["hf_static"], last["hf_cb"]),
            "vllm_vs_hf_cb": report.greedy_agreement(last.get("vllm"), last["hf_cb"]),
        },
        "torch_threads": torch.get_num_threads(),
        "model": {
            "dir": str(model_dir),
            "non_embedding_params": shape.non_embedding_params,
            "vocab_size": shape.vocab_size,
            "hidden_size": shape.hidden_size,
            "layers": shape.num_layers,
        },
        "hf_static_batch_size": STATIC_BATCH_SIZE,
        "hf_cb_config": hf_cb.describe(),
        "engine_config": engine.describe() if engine is not None else None,
        "bench_seconds": time.perf_counter() - bench_start,
    }
    if args.vllm_python is not None:
        result["vllm_tok_s"] = tok_s["vllm"]
        result["speedup_vs_vllm"] = report.ratio(engine_tok_s, tok_s["vllm"])
    scratch.cleanup()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
