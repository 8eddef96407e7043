"""Preemption points: where a running forward pass may let other work run before it goes on.

Layer-level preemption (the engine's, see engine/llm_engine.py) needs a wide batch step to pause every
few milliseconds so a chat prompt that arrived meanwhile gets its first token at once, in a step nested
inside the paused one. The model knows nothing of engines: it only calls the PreemptionPoints object it
was handed at the places where pausing is safe (this layer's K/V already written, no half-built
output), and slices its longest stretches so those places come often enough. Given none (None, the
default) a forward is the plain computation with no slicing and no calls, which is what torch.compile or
CUDA-graph capture see.

The granularity was measured on this project's CPU runs: with these slice sizes a prompt waits for
about 10 ms of a batch step, whatever the batch's width.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# A step's projections and MLP run this many token rows between two points ...
ROWS_PER_SLICE = 128
# ... a long prefill chunk attends this many queries ...
QUERIES_PER_SLICE = 128
# ... and the LM head computes this many vocabulary entries.
VOCAB_PER_SLICE = 8192


class PreemptionPoints:
    """The hook a model calls at each preemption point of one forward pass. Owned by whoever runs the
    forward (the engine's model runner), which decides what runs there; run_others may run further
    forwards of the same model, each with its own attention context."""

    def __init__(self, run_others: Callable[[], None]) -> None:
        self._run_others = run_others

    def __call__(self) -> None:
        self._run_others()


def in_row_slices(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, points: PreemptionPoints | None
) -> torch.Tensor:
    """fn(x) for an fn of independent rows; with points, in slices of ROWS_PER_SLICE rows with a point
    between them: a wide step's projections and MLP are its longest stretches, and slicing changes
    nothing but where other steps may cut in."""
    rows = x.shape[0]
    if points is None or rows <= ROWS_PER_SLICE:
        return fn(x)
    first = fn(x[:ROWS_PER_SLICE])
    out = first.new_empty((rows, *first.shape[1:]))
    out[:ROWS_PER_SLICE] = first
    for start in range(ROWS_PER_SLICE, rows, ROWS_PER_SLICE):
        points()
        end = min(start + ROWS_PER_SLICE, rows)
        out[start:end] = fn(x[start:end])
    return out
