"""asyncio front of the engine: the engine steps in its own thread; the event loop never waits on a model.

Callers' commands (add, abort) cross to the engine thread through a queue and are applied between
steps; each step's outputs cross back in one `call_soon_threadsafe`, fanned out to per-request queues.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from services.worker.engine.errors import EngineDeadError, InvalidRequestError
from services.worker.engine.llm_engine import LLMEngine
from services.worker.engine.outputs import RequestOutput, merge
from services.worker.engine.policy.classes import DEFAULT_HINTS, SchedulingHints
from services.worker.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    hints: SchedulingHints
    arrival_time: float  # time.monotonic() when generate() was called
    done: concurrent.futures.Future[None]


@dataclass
class _Abort:
    request_id: str


class AsyncLLM:
    """Streaming generation over one LLMEngine. Use as `async with AsyncLLM(engine) as llm:`."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        self._dead: BaseException | None = None
        self._idle = asyncio.Event()  # set whenever the engine has nothing in flight
        self._idle.set()
        # Commands put (loop side) and applied (engine side): "idle" counts only once both agree.
        self._submitted = 0
        self._applied = 0

    async def __aenter__(self) -> AsyncLLM:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def start(self) -> None:
        """Start the engine thread; call from the event loop that will consume the streams."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-step", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Abort everything in flight and join the engine thread."""
        if self._thread is None:
            return
        for request_id in list(self._streams):
            self._put(_Abort(request_id))
        self._commands.put(None)
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        hints: SchedulingHints = DEFAULT_HINTS,
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs; InvalidRequestError before the first output on bad input,
        AdmissionError when the engine refuses it (its class's queue is full, or it waited too long).

        Leaving the iteration early (the caller was cancelled or broke out) aborts the request at once.
        """
        if self._dead is not None or self._thread is None:
            raise EngineDeadError(
                f"engine is not running: {self._dead!r}" if self._dead else "engine not started"
            )
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise InvalidRequestError("request_id", f"{request_id!r} is already in flight")
        stream: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[request_id] = stream
        finished = False
        try:
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._put(_Add(request_id, prompt, params, hints, time.monotonic(), done))
            await asyncio.wrap_future(done)
            while True:
                item = await stream.get()
                # A consumer that fell behind gets everything queued in one output: fewer, larger
                # messages downstream exactly when the process is too busy to send one per token.
                while not isinstance(item, BaseException) and not item.finished and not stream.empty():
                    following = stream.get_nowait()
                    item = following if isinstance(following, BaseException) else merge(item, following)
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if item.error is not None:
                    finished = True
                    raise item.error
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._put(_Abort(request_id))

    async def wait_idle(self) -> None:
        """Return once the engine has nothing in flight (every request finished or aborted)."""
        await self._idle.wait()

    def abort(self, request_id: str) -> None:
        """Ask the engine to stop request_id before its next step; its stream ends with finish_reason abort.
        Call from the event loop's thread."""
        self._put(_Abort(request_id))

    def _put(self, command: _Add | _Abort) -> None:
        self._submitted += 1
        self._idle.clear()
        self._commands.put(command)

    # --- engine thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                # Block only when there is nothing to step; otherwise drain whatever arrived meanwhile.
                block = not engine.has_unfinished_requests()
                if not self._apply_commands(block):
                    return
                if not engine.has_unfinished_requests():
                    self._deliver([], True)
                    continue
                outputs = engine.step()
                if outputs:
                    self._deliver(outputs, not engine.has_unfinished_requests())
        except BaseException as exc:  # the engine is unusable: tell every waiting stream why
            log.exception("engine step failed; failing all requests")
            self._dead = exc
            error = EngineDeadError(f"engine step failed: {exc!r}")
            self._deliver_error(error)
            self._refuse_pending(error)

    def _refuse_pending(self, error: EngineDeadError) -> None:
        """Fail adds that were queued when the engine died, so no caller waits forever."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add):
                command.done.set_exception(error)

    def _apply_commands(self, block: bool) -> bool:
        """Apply queued adds/aborts; False when shutdown was requested."""
        try:
            command = self._commands.get(block=block)
        except queue.Empty:
            return True
        while True:
            if command is None:
                return False
            self._applied += 1
            if isinstance(command, _Add):
                try:
                    self.engine.add_request(
                        command.request_id,
                        command.prompt,
                        command.params,
                        hints=command.hints,
                        arrival_time=command.arrival_time,
                    )
                    command.done.set_result(None)
                except Exception as exc:  # bad input: only this request fails
                    command.done.set_exception(exc)
            else:
                final = self.engine.abort_request(command.request_id)
                if final is not None:
                    self._deliver([final], False)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _deliver(self, outputs: list[RequestOutput], idle: bool) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._fan_out, outputs, idle, self._applied)

    def _deliver_error(self, error: BaseException) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._fail_all, error)

    def _fan_out(self, outputs: list[RequestOutput], idle: bool, applied: int) -> None:
        if idle and applied == self._submitted:
            self._idle.set()
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                stream.put_nowait(out)

    def _fail_all(self, error: BaseException) -> None:
        for stream in self._streams.values():
            stream.put_nowait(error)
