"""hanzo_worker_iteration_tokens_total (vllm:iteration_tokens_total): a histogram of tokens per engine
step. The engine thread counts its steps per bucket (EngineStats.steps_by_tokens); observing each step
from the event loop would need every step's count handed over, so this collector is fed the engines'
bucket counts as they grow and serves them as one histogram per model at scrape time."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric

from services.worker.engine.llm_engine import ITERATION_TOKEN_BUCKETS

NAME = "hanzo_worker_iteration_tokens_total"


class IterationTokens:
    """Registered in registry on creation; add() from the event loop, collect() from the scrape thread."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._lock = threading.Lock()
        self._steps: dict[str, Counter[int]] = {}  # model -> bucket index -> steps (cumulative)
        self._tokens: dict[str, int] = {}
        registry.register(self)

    def add(self, model: str, steps_gained: Mapping[int, int], tokens_gained: int) -> None:
        """Steps a model's engine ran since the last add, per bucket index, and the tokens they ran."""
        with self._lock:
            self._steps.setdefault(model, Counter()).update(steps_gained)
            self._tokens[model] = self._tokens.get(model, 0) + tokens_gained

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            NAME, "Tokens per engine step: prompt chunks plus decode rows (vllm:iteration_tokens_total)",
            labels=["model_name"],
        )  # fmt: skip
        with self._lock:
            models = [(m, dict(steps), self._tokens[m]) for m, steps in self._steps.items()]
        for model, steps, tokens in models:
            buckets, cumulative = [], 0
            for index, bound in enumerate((*ITERATION_TOKEN_BUCKETS, float("inf"))):
                cumulative += steps.get(index, 0)
                buckets.append(("+Inf" if bound == float("inf") else str(float(bound)), cumulative))
            family.add_metric([model], buckets, sum_value=tokens)
        yield family
