"""How a running step hears of new work: what LLMEngine.step needs for layer-level preemption."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.worker.engine.outputs import RequestOutput


@dataclass(frozen=True)
class StepInterrupts:
    """poll(): called between the model's layers while a step runs; it adds the requests that arrived
    meanwhile with engine.add_request, and calls nothing else on the engine (no aborts: a request of the
    running step must keep its blocks until the step ends). deliver(outputs): takes the outputs of a
    step nested between those layers (latency-class prompts' first tokens) as soon as they exist,
    rather than when the outer step returns."""

    poll: Callable[[], None]
    deliver: Callable[[list[RequestOutput]], None]
