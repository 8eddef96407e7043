"""Measure an engine step against the bare model forward for the same batch (for bench/)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from services.common.sampling import SamplingParams
from services.worker.engine.llm import LLM


@dataclass(frozen=True)
class DecodeStepTiming:
    step_ms: float  # median wall time of a whole engine step (schedule, prepare, forward, sample, update)
    forward_ms: float  # median wall time of the model forward + LM head alone, on the same batch
    steps_ms: tuple[float, ...] = ()  # every step's wall time, in order
    step_ends: tuple[float, ...] = ()  # time.perf_counter() at the end of each step


def measure_decode_step(
    llm: LLM,
    batch_size: int = 32,
    context_len: int = 256,
    steps: int = 20,
    params: Callable[[int], SamplingParams] | None = None,
) -> DecodeStepTiming:
    """Time decode steps with batch_size running sequences of ~context_len tokens; leaves the engine idle.
    params(i): sequence i's sampling (None: greedy); max_tokens and ignore_eos are set for the run."""
    engine = llm.engine
    generator = torch.Generator().manual_seed(1234)
    vocab = engine.model_config.vocab_size
    budget = {"max_tokens": steps * 4 + 8, "ignore_eos": True}
    ids = [f"profile-{i}" for i in range(batch_size)]
    for i, request_id in enumerate(ids):
        prompt = torch.randint(0, vocab, (context_len,), generator=generator).tolist()
        chosen = SamplingParams(temperature=0.0) if params is None else params(i)
        engine.add_request(request_id, prompt, dataclasses.replace(chosen, **budget), detokenize=False)
    try:
        # Run the prefills until every sequence decodes (one token per step).
        while True:
            batch = engine.scheduler.schedule()
            if batch is None:
                raise RuntimeError("profiling batch vanished; is the KV pool too small?")
            sampled = engine.runner.execute(batch)
            engine.scheduler.update(batch, sampled)
            if len(batch.seqs) == batch_size and batch.total_tokens == batch_size:
                break
        step_times, forward_times, step_ends = [], [], []
        # Alternate the two measurements so drift in machine load hits both alike.
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            _sync(engine.device)
            step_ends.append(time.perf_counter())
            step_times.append(step_ends[-1] - start)
            batch = engine.scheduler.schedule()
            assert batch is not None
            inputs = engine.runner.prepare(batch)
            start = time.perf_counter()
            engine.runner.forward(inputs)
            _sync(engine.device)
            forward_times.append(time.perf_counter() - start)
            engine.scheduler.update(batch, [0] * len(batch.seqs))
    finally:
        for request_id in ids:
            engine.abort_request(request_id)
    return DecodeStepTiming(
        statistics.median(step_times) * 1e3,
        statistics.median(forward_times) * 1e3,
        tuple(t * 1e3 for t in step_times),
        tuple(step_ends),
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
