"""Multi-model serving: how fast an evicted model comes back from its host copy (against loading it from disk
and against a plain torch copy of the same bytes), what switching between two resident models costs a decode
step, and the throughput of three models served from ONE worker process against THREE single-model workers
on the same cores; prints one JSON line on stdout, progress on stderr.

    .venv/bin/python bench/multimodel.py [--quick] [--device cpu|cuda] [--repeats N] [--model-dir DIR]
        [--serving-threads N] [--skip-serving] [--seed N]

Load timings are the median of --repeats runs; disk loads read a warm page cache. Switch overhead: the p50 and
p99 of a decode step right after a step of the other resident model, minus those of a step after the same
model. One-vs-three workers (bench/multimodel_serving.py, whose docstring defines every key): real
`python -m services.worker` processes over loopback gRPC, the same seeded workload in both configurations,
alternating which goes first by round; on CPU whatever --device (RSS is then the whole footprint).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Run as a script, Python put bench/ (not the repo root) on sys.path; `bench` and `services` live in the root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.checkpoint import DEFAULT_MODEL_DIR as DEFAULT_SMALL_DIR
from bench.checkpoint import LLAMA_19M, ensure_checkpoint
from bench.progress import log
from services.common.sampling import SamplingParams
from services.worker.engine.config import EngineConfig
from services.worker.engine.llm_engine import LLMEngine
from services.worker.memory.arena import Arena
from services.worker.memory.host_copy import HostCopy
from services.worker.memory.manager import MemoryManager

DEFAULT_MODEL_DIR = Path(".cache/bench/llama-100m")
# 2 x 32000 x 320 embedding/LM-head params + 4 layers of attention and MLP: ~25.6M float32 parameters,
# ~102 MB of weights, the "~100 MB model".
LLAMA_100MB = {**LLAMA_19M, "hidden_size": 320, "intermediate_size": 1024}
# A small KV pool, so that both load paths time the weights rather than zeroing a cache.
KV_CACHE_BYTES = 4 * 1024**2
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROBE_PROMPT = list(range(1, 33))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats: well under two minutes")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per measurement (default 10)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument(
        "--serving-threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS of every worker process in the one-vs-three-workers part (default 1: one "
        "compute thread per model in both configurations; see bench/multimodel_serving.py)",
    )
    parser.add_argument("--skip-serving", action="store_true", help="leave out the one-vs-three-workers part")
    parser.add_argument("--seed", type=int, default=0, help="seed of the serving workload's requests")
    args = parser.parse_args()
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.serving_threads < 1:
        parser.error("--serving-threads must be at least 1")
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall time of fn() in ms over repeats runs, after one untimed warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def first_tokens(engine: LLMEngine) -> list[int]:
    """The greedy tokens of one probe prompt: proof that a reloaded model computes what it did."""
    engine.add_request("probe", PROBE_PROMPT, GREEDY, detokenize=False)
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
    return tokens


def switch_overhead_us(config: EngineConfig, device: torch.device, steps: int) -> tuple[float, float]:
    """(p50, p99) of the time a decode step of a resident model takes beyond a step of the same model
    when the previous step served the other resident model. Two copies of the small bench model share
    one arena, each decoding 8 requests; the next model is drawn at random (seeded) every step."""
    model_dir = ensure_checkpoint(DEFAULT_SMALL_DIR)
    memory = MemoryManager(Arena(1 << 30, device))
    engines = [LLMEngine(model_dir, config, memory=memory, model_name=name) for name in ("a", "b")]
    long_run = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    for engine in engines:
        for i in range(8):
            engine.add_request(f"r{i}", list(range(1 + i, 65 + i)), long_run, detokenize=False)
        started: set[str] = set()
        while len(started) < 8:  # until every prefill is done: each timed step is then 8 decodes
            started.update(out.request_id for out in engine.step() if out.new_token_ids)
    rng = random.Random(0)
    after_same: list[float] = []
    after_other: list[float] = []
    previous = 0
    for _ in range(steps):
        current = rng.randrange(2)
        sync(device)
        start = time.perf_counter()
        engines[current].step()
        sync(device)
        (after_same if current == previous else after_other).append((time.perf_counter() - start) * 1e6)
        previous = current
    for engine in engines:
        engine.evict(abort_running=True, keep_host_copy=False)
    p50 = statistics.median(after_other) - statistics.median(after_same)
    p99 = _p99(after_other) - _p99(after_same)
    return p50, p99


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def main() -> None:
    args = parse_args()
    repeats = args.repeats or (3 if args.quick else 10)
    device = torch.device(args.device)
    model_dir = ensure_checkpoint(args.model_dir, LLAMA_100MB)
    config = EngineConfig(device=args.device, kv_cache_bytes=KV_CACHE_BYTES, max_num_batched_tokens=64)

    probe = MemoryManager(Arena(1 << 30, device))
    engine = LLMEngine(model_dir, config, memory=probe, model_name="probe")
    partition_bytes = probe.partition("probe").nbytes
    expected = first_tokens(engine)
    engine.evict(keep_host_copy=False)
    del probe, engine
    # Room for exactly one copy of the model, so every load reuses the same bytes.
    memory = MemoryManager(Arena(partition_bytes, device))

    def from_disk() -> None:
        LLMEngine(model_dir, config, memory=memory, model_name="m").evict(keep_host_copy=False)

    log("timing load from disk")
    load_from_disk_ms = median_ms(from_disk, repeats, device)

    engine = LLMEngine(model_dir, config, memory=memory, model_name="m")
    evict_times = []
    host: HostCopy | None = None
    for _ in range(repeats):
        start = time.perf_counter()
        host = engine.evict()
        evict_times.append((time.perf_counter() - start) * 1e3)
        assert host is not None
        engine = LLMEngine(host, config, memory=memory)
    assert host is not None

    def from_host() -> None:
        LLMEngine(host, config, memory=memory).evict(keep_host_copy=False)

    engine.evict(keep_host_copy=False)
    log(f"timing reload from a {'pinned ' if host.pinned else ''}host copy of {host.nbytes:,} bytes")
    reload_from_host_ms = median_ms(from_host, repeats, device)
    reloaded = LLMEngine(host, config, memory=memory)
    outputs_match = first_tokens(reloaded) == expected

    # The limit: one torch copy of the same bytes from host memory of the same kind into the device.
    source = torch.empty(host.nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    source.random_(0, 256)
    target = torch.empty(host.nbytes, dtype=torch.uint8, device=device)
    plain_copy_ms = median_ms(lambda: target.copy_(source, non_blocking=source.is_pinned()), repeats, device)

    log("timing steps after a switch between two resident models")
    switch_p50, switch_p99 = switch_overhead_us(config, device, 300 if args.quick else 1500)

    serving: dict[str, object] = {}
    if not args.skip_serving:
        log("serving three models from one worker process and from three")
        # Imported here: it needs the gRPC stack (health, reflection, the services), which a GPU machine
        # running only the in-process measurements (--skip-serving, bench/gpu_check.sh) may not have.
        from bench.multimodel_serving import measure_serving

        serving = measure_serving(args.quick, args.serving_threads, args.seed, DEFAULT_MODEL_DIR.parent)

    print(
        json.dumps(
            {
                "device": str(device),
                "model_bytes": host.nbytes,
                "repeats": repeats,
                "load_from_disk_ms": round(load_from_disk_ms, 3),
                "reload_from_host_ms": round(reload_from_host_ms, 3),
                "evict_to_host_ms": round(statistics.median(evict_times), 3),
                "plain_copy_ms": round(plain_copy_ms, 3),
                "host_copy_gbps": round(host.nbytes / reload_from_host_ms / 1e6, 3),
                "plain_copy_gbps": round(host.nbytes / plain_copy_ms / 1e6, 3),
                "reload_vs_plain_copy": round(reload_from_host_ms / plain_copy_ms, 3),
                "disk_vs_host_speedup": round(load_from_disk_ms / reload_from_host_ms, 3),
                "host_copy_pinned": host.pinned,
                "outputs_match_after_reload": outputs_match,
                "switch_overhead_us_p50": round(switch_p50, 1),
                "switch_overhead_us_p99": round(switch_p99, 1),
                **serving,
            }
        )
    )


if __name__ == "__main__":
    main()
