"""The iteration-token histogram: a step counts in the smallest of vLLM's buckets that holds its tokens,
buckets are cumulative, and what engines add accumulates per model."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from services.worker.engine.llm_engine import ITERATION_TOKEN_BUCKETS, iteration_bucket
from services.worker.server.iteration_metrics import NAME, IterationTokens


@pytest.mark.parametrize(
    ("tokens", "bound"), [(1, 1), (2, 8), (8, 8), (9, 16), (2048, 2048), (2049, 4096), (16384, 16384)]
)
def test_a_step_counts_in_the_smallest_bucket_holding_its_tokens(tokens: int, bound: int) -> None:
    assert ITERATION_TOKEN_BUCKETS[iteration_bucket(tokens)] == bound


def test_past_the_last_bound_a_step_counts_only_in_inf() -> None:
    assert iteration_bucket(16385) == len(ITERATION_TOKEN_BUCKETS)


def test_the_histogram_is_cumulative_per_model_across_adds() -> None:
    registry = CollectorRegistry()
    histogram = IterationTokens(registry)
    histogram.add("a", {iteration_bucket(5): 2, iteration_bucket(100): 1}, 110)
    histogram.add("a", {iteration_bucket(20000): 1}, 20000)
    histogram.add("b", {iteration_bucket(1): 3}, 3)

    def bucket(model: str, le: str) -> float | None:
        return registry.get_sample_value(f"{NAME}_bucket", {"model_name": model, "le": le})

    bounds = ("1.0", "8.0", "64.0", "128.0", "16384.0", "+Inf")
    assert [bucket("a", le) for le in bounds] == [0, 2, 2, 3, 3, 4]
    assert registry.get_sample_value(f"{NAME}_count", {"model_name": "a"}) == 4
    assert registry.get_sample_value(f"{NAME}_sum", {"model_name": "a"}) == 20110
    assert bucket("b", "1.0") == 3 and bucket("b", "+Inf") == 3
