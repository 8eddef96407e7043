"""Our engine (services.worker.engine) as a benchmark contender, plus its per-step overhead probe."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.workload import RunResult, Workload
from services.worker.engine import LLM, SamplingParams
from services.worker.engine.profiling import measure_decode_step


class OurEngine:
    """Builds `LLM` once (not timed); each `run` times one `generate` over the whole workload."""

    def __init__(self, model_dir: Path, engine_kwargs: dict[str, Any]) -> None:
        self._engine_kwargs = dict(engine_kwargs)
        self.llm = LLM(str(model_dir), dtype="float32", **engine_kwargs)

    def describe(self) -> dict[str, object]:
        """The non-default settings that ran, for the JSON report."""
        return dict(self._engine_kwargs)

    def run(self, workload: Workload) -> RunResult:
        """Greedy, EOS ignored, all requests submitted at t=0; wall time covers prefill and decode."""
        params = [
            SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in workload.output_lens
        ]
        start = time.perf_counter()
        outs = self.llm.generate([list(p) for p in workload.prompts], params)
        wall = time.perf_counter() - start
        token_ids = [list(o.token_ids) for o in outs]
        mismatches = sum(len(t) != n for t, n in zip(token_ids, workload.output_lens, strict=True))
        mismatches += abs(len(outs) - len(workload.prompts))
        return RunResult(wall, workload.output_tokens, mismatches, token_ids)

    def decode_step(
        self, batch_size: int = 32, context_len: int = 256, steps: int = 20
    ) -> tuple[float, float]:
        """(median engine step ms, median model forward ms) with `batch_size` sequences decoding."""
        timing = measure_decode_step(self.llm, batch_size=batch_size, context_len=context_len, steps=steps)
        return timing.step_ms, timing.forward_ms
