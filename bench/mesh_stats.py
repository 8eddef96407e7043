"""Summaries for bench/mesh.py: paired per-request latency differences and token agreement."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from bench.mesh_client import Timed

# results[round][request index] for one route
Grid = Sequence[Sequence[Timed]]


def percentile_ms(values_s: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100, linear interpolation) of values in seconds, in milliseconds."""
    return float(np.percentile(np.asarray(values_s), q)) * 1e3


def paired_added_s(gateway: Grid, direct: Grid, field: str) -> list[float]:
    """Per request index: the median over rounds of (gateway - direct) for field ("ttft_s" or "e2e_s").

    Pairing by (round, index) cancels what the request itself costs (its prompt length, its prefill);
    the median over rounds drops a round where a background job or GC hit one of the two calls."""
    per_request = []
    for i in range(len(direct[0])):
        diffs = [getattr(g[i], field) - getattr(d[i], field) for g, d in zip(gateway, direct, strict=True)]
        per_request.append(statistics.median(diffs))
    return per_request


def flat(grid: Grid, field: str) -> list[float]:
    """Every sample of field over all rounds and requests."""
    return [getattr(t, field) for row in grid for t in row]


def mismatches(a: Grid, b: Grid) -> int:
    """(round, index) pairs whose token ids differ between the two routes."""
    return sum(
        x.token_ids != y.token_ids for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)
    )


def wrong_lengths(grid: Grid, max_tokens: int) -> int:
    """Streams that did not deliver exactly max_tokens token ids."""
    return sum(len(t.token_ids) != max_tokens for row in grid for t in row)


def unstable(grid: Grid) -> int:
    """Requests whose token ids changed between rounds on one route (greedy must repeat itself)."""
    return sum(len({row[i].token_ids for row in grid}) > 1 for i in range(len(grid[0])))
