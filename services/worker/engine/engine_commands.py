"""The commands AsyncLLM's callers send to its engine thread, and the futures that answer them.

Each crosses the thread boundary through AsyncLLM's command queue and is applied between steps, in the
order sent (async_llm.py says when and how); a Hold parks the engine thread on its own queue, through
which HeldEngine.call still reaches it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from services.common.sampling import SamplingParams
from services.worker.engine.llm_engine import LLMEngine
from services.worker.engine.policy.classes import SchedulingHints

T = TypeVar("T")


@dataclass
class Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    hints: SchedulingHints
    arrival_time: float  # time.monotonic() when generate() was called
    done: concurrent.futures.Future[None]
    grammar: object | None = None  # params.structured compiled off the engine thread


@dataclass
class Abort:
    request_id: str


@dataclass
class Call:
    fn: Callable[[LLMEngine], Any]
    done: concurrent.futures.Future[Any]


@dataclass
class Hold:
    held: concurrent.futures.Future[None]  # resolved once the engine thread has stopped stepping
    calls: queue.SimpleQueue[Call | None] = field(default_factory=queue.SimpleQueue)  # None releases
    released: bool = False  # set on the loop side when the paused() block exits


Command = Add | Abort | Call | Hold


class HeldEngine:
    """An engine whose thread is parked by AsyncLLM.paused(): no steps, no commands applied."""

    def __init__(self, engine: LLMEngine, hold: Hold) -> None:
        self.engine = engine  # safe to read from the loop while held; run heavy work through call()
        self._hold = hold

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """fn(engine) run on the held engine thread; its result, or its exception raised here.
        RuntimeError once the paused() block has exited (nothing would run it)."""
        if self._hold.released:
            raise RuntimeError("the engine is no longer held; use AsyncLLM.call")
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._hold.calls.put(Call(fn, done))
        return await asyncio.wrap_future(done)


def run_call(engine: LLMEngine, call: Call) -> None:
    """Run call.fn unless its caller was cancelled already (as an executor would); hand back its result."""
    if not call.done.set_running_or_notify_cancel():
        return
    try:
        result = call.fn(engine)
    except Exception as exc:  # the caller's function failed, not the engine: hand it back
        call.done.set_exception(exc)
    else:
        call.done.set_result(result)


def settle(
    future: concurrent.futures.Future[Any], result: object = None, *, error: BaseException | None = None
) -> None:
    """Resolve future unless its awaiting caller was cancelled (a cancelled future refuses a result)."""
    if future.set_running_or_notify_cancel():
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
