"""asyncio front of the engine: the engine steps in its own thread; the event loop never waits on a model.

Callers' commands (add, abort, call, hold) cross to the engine thread through a queue and are applied
between steps, in the order they were sent; each step's outputs cross back in one
`call_soon_threadsafe`, fanned out to per-request queues. While a step runs, the engine polls the queue
between the model's layers (layer-level preemption): adds at the front of the queue are applied at once,
so a latency-class prompt can run nested in that step; the first other command stops the polling, and it
and everything after it wait for the step to end, still in order.

Holding (`async with llm.paused() as held:`) parks the engine thread on the hold's own queue: no step
runs and no later command is applied until the block exits, while `held.call(fn)` still runs fn on
that thread. It cannot deadlock on its own: an engine thread only ever waits for its command queue or
its hold's queue, both fed from the event loop, and it never waits for another engine. Holding several
engines is safe in any order. What does wait forever is awaiting, inside the block, anything the held
engine must do first: a stream's next output, wait_idle(), shutdown(), or a call() (use held.call).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import torch

from services.common.sampling import SamplingParams
from services.worker.engine.engine_commands import (
    Abort,
    Add,
    Call,
    Command,
    HeldEngine,
    Hold,
    run_call,
    settle,
)
from services.worker.engine.errors import EngineDeadError, InvalidRequestError
from services.worker.engine.grammar import COMPILE_EXECUTOR
from services.worker.engine.llm_engine import LLMEngine
from services.worker.engine.outputs import RequestOutput, merge
from services.worker.engine.policy.classes import DEFAULT_HINTS, SchedulingHints
from services.worker.engine.snapshot import EngineSnapshot, snapshot_of
from services.worker.engine.step_interrupts import StepInterrupts
from services.worker.engine.step_log import StepLog, StepShape

log = logging.getLogger(__name__)

T = TypeVar("T")

# While a step runs, its snapshot is republished at least this often (and whenever it takes an arrival):
# heartbeats go every second, so fresher buys the placer nothing; a snapshot costs a few microseconds.
_MID_STEP_PUBLISH_S = 0.1


class AsyncLLM:
    """Streaming generation over one LLMEngine. Use as `async with AsyncLLM(engine) as llm:`."""

    def __init__(self, engine: LLMEngine, step_log: StepLog | None = None) -> None:
        """step_log: where the engine thread records each iteration's shape and wall time (step_log.py)."""
        self.engine = engine
        self._step_log = step_log
        # Requests the engine thread took since the last logged step, with the wall clock then (logged
        # only): when a request reached the engine, apart from the gateway and the RPC before it.
        self._added_log: list[tuple[str, float]] = []
        self._commands: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
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
        # At most one command taken off the queue mid-step and kept for after the step (None: shutdown).
        self._deferred: list[Command | None] = []
        self._holds = 0  # holds the engine thread has parked for (its step log skips the time)
        self._interrupts = StepInterrupts(poll=self._poll_adds, deliver=self._deliver_nested)
        # Replaced (one reference assignment) by the engine thread after its commands, each step and
        # before each delivery, and while a step runs (_poll_adds).
        self.snapshot: EngineSnapshot = snapshot_of(engine)
        self._published_s = time.perf_counter()

    @property
    def num_in_flight(self) -> int:
        """Requests generate() has submitted that have not finished: exact on the event loop, queued
        commands included, unlike a snapshot taken on the engine thread."""
        return len(self._streams)

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
            self._put(Abort(request_id))
        self._commands.put(None)
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        if self._step_log is not None:
            self._step_log.close()

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
        self._check_alive()
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise InvalidRequestError("request_id", f"{request_id!r} is already in flight")
        stream: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[request_id] = stream
        finished = False
        try:
            arrival = time.monotonic()
            grammar = None
            if params.structured is not None:  # compiled here, never on the engine thread
                grammar = await asyncio.get_running_loop().run_in_executor(
                    COMPILE_EXECUTOR, self.engine.grammars.compile, params
                )
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._put(Add(request_id, prompt, params, hints, arrival, done, grammar))
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
                self._put(Abort(request_id))

    async def wait_idle(self) -> None:
        """Return once the engine has nothing in flight (every request finished or aborted)."""
        await self._idle.wait()

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """fn(engine) run on the engine thread between steps, after every command sent before it; its
        result, or its exception raised here (the engine keeps running). EngineDeadError if it stopped."""
        self._check_alive()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(Call(fn, done))
        return await asyncio.wrap_future(done)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[HeldEngine]:
        """Hold the engine thread between steps for the duration of the block (see the module docstring
        for what not to await inside it); yields a HeldEngine to inspect or call it. Commands sent
        meanwhile are applied after the block. EngineDeadError if the engine stopped."""
        self._check_alive()
        hold = Hold(concurrent.futures.Future())
        self._put(hold)
        try:
            await asyncio.wrap_future(hold.held)
            yield HeldEngine(self.engine, hold)
        finally:
            hold.released = True
            hold.calls.put(None)  # also when cancelled before the hold began: the thread then passes it

    def abort(self, request_id: str) -> None:
        """Ask the engine to stop request_id before its next step; its stream ends with finish_reason abort.
        Call from the event loop's thread."""
        self._put(Abort(request_id))

    def _check_alive(self) -> None:
        if self._dead is not None or self._thread is None:
            raise EngineDeadError(
                f"engine is not running: {self._dead!r}" if self._dead else "engine not started"
            )

    def _put(self, command: Command) -> None:
        self._submitted += 1
        self._idle.clear()
        self._commands.put(command)
        if self._dead is not None:
            # The engine thread sets _dead before it drains the queue, so either that drain saw this
            # command or we see _dead here: no caller waits forever on a command nobody will apply.
            self._refuse_pending(EngineDeadError(f"engine step failed: {self._dead!r}"))

    # --- engine thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        # Each engine thread issues its model's kernels on a stream of its own: resident models that step
        # at the same time overlap on the GPU (spatial sharing) instead of queueing on the default stream.
        with _own_stream(self.engine.device):
            self._step_loop()

    def _step_loop(self) -> None:
        engine = self.engine
        step_log = self._step_log
        logged: tuple[StepShape, float] | None = None  # the iteration being timed and its start
        try:
            while True:
                # Block only when there is nothing to step; otherwise drain whatever arrived meanwhile.
                block = not engine.has_unfinished_requests()
                if logged is not None and block:  # idle from here: the wait is not the step's
                    self._log_iteration(logged)
                    logged = None
                applied, holds = self._applied, self._holds
                if not self._apply_commands(block):
                    return
                if self._holds != holds:  # parked by a hold meanwhile: that time is no step's
                    logged = None
                if not engine.has_unfinished_requests():
                    self._deliver([], True)  # publishes the snapshot
                    continue
                if self._applied != applied:  # the queues changed: publish them before a long step
                    self._publish()
                if step_log is not None:
                    # The previous iteration ends where this one starts: outputs handed over, commands
                    # taken, all in its time, as they pace the caller's tokens.
                    if logged is not None:
                        self._log_iteration(logged)
                    scheduler = engine.scheduler
                    shape = StepShape(running=scheduler.num_running, waiting=scheduler.num_waiting)
                    logged = (shape, time.perf_counter())
                    engine.step_shape = logged[0]
                outputs = engine.step(self._interrupts)
                if outputs:
                    self._deliver(outputs, not engine.has_unfinished_requests())
                else:  # a prefill chunk: its blocks are taken, nothing to deliver
                    self._publish()
        except BaseException as exc:  # the engine is unusable: tell every waiting stream why
            log.exception("engine step failed; failing all requests")
            self._dead = exc
            error = EngineDeadError(f"engine step failed: {exc!r}")
            self._deliver_error(error)
            self._refuse_pending(error)

    def _log_iteration(self, logged: tuple[StepShape, float]) -> None:
        """Write a timed iteration that ran a batch (one that only applied commands is not a step), with
        the requests taken since the last one written."""
        shape, started = logged
        if self._step_log is not None and shape.batches:
            shape.added, self._added_log = self._added_log, []
            self._step_log.write_step(shape, time.perf_counter() - started)

    def _refuse_pending(self, error: EngineDeadError) -> None:
        """Fail adds that were queued when the engine died, so no caller waits forever."""
        while True:
            try:
                command = self._deferred.pop() if self._deferred else self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, Add | Call):
                settle(command.done, error=error)
            elif isinstance(command, Hold):
                settle(command.held, error=error)

    def _poll_adds(self) -> None:
        """Between a running step's layers: apply the adds at the front of the queue, and stop at the
        first other command (kept for after the step, so the order of commands holds). Publishes the
        snapshot when it took any, and at least every _MID_STEP_PUBLISH_S while the step runs."""
        applied = self._applied
        while not self._deferred:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, Add):
                self._applied += 1
                self._add(command)
            else:
                self._deferred.append(command)
        # One engine.step() can run for seconds (a long prompt's chunks on a CPU, urgent rounds ahead of
        # the batch step). Published only around it, the heartbeat would report the queues from before it
        # started for all that time: the placer saw a worker prefilling a 3,000-token prompt as idle for
        # 7 s and sent it the next documents while the other worker idled (docs/simulator.md, item 4).
        if self._applied != applied or time.perf_counter() - self._published_s >= _MID_STEP_PUBLISH_S:
            self._publish()

    def _publish(self) -> None:
        """Replace the snapshot readers see with the engine's state now (on the engine thread)."""
        self.snapshot = snapshot_of(self.engine)
        self._published_s = time.perf_counter()

    def _deliver_nested(self, outputs: list[RequestOutput]) -> None:
        self._deliver(outputs, False)

    def _add(self, command: Add) -> None:
        try:
            self.engine.add_request(
                command.request_id,
                command.prompt,
                command.params,
                hints=command.hints,
                arrival_time=command.arrival_time,
                grammar=command.grammar,
            )
            settle(command.done, None)
            if self._step_log is not None:
                self._added_log.append((command.request_id, time.time()))
        except Exception as exc:  # bad input: only this request fails
            settle(command.done, error=exc)

    def _apply_commands(self, block: bool) -> bool:
        """Apply queued adds/aborts; False when shutdown was requested."""
        if self._deferred:
            command = self._deferred.pop()
        else:
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                return True
        while True:
            if command is None:
                return False
            self._applied += 1
            if isinstance(command, Add):
                self._add(command)
            elif isinstance(command, Call):
                run_call(self.engine, command)
            elif isinstance(command, Hold):
                self._hold(command)
            else:
                final = self.engine.abort_request(command.request_id)
                if final is not None:
                    self._deliver([final], False)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _hold(self, hold: Hold) -> None:
        """Park this thread, running hold's calls, until the holder releases it."""
        self._holds += 1
        settle(hold.held, None)
        while (call := hold.calls.get()) is not None:
            run_call(self.engine, call)

    def _deliver(self, outputs: list[RequestOutput], idle: bool) -> None:
        assert self._loop is not None
        # Published first: a reader that has seen an output sees a snapshot at least as new (nested
        # steps deliver in the middle of a step).
        self._publish()
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


def _own_stream(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """A new CUDA stream made current for the calling thread on a CUDA device; a no-op elsewhere."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.Stream(device))
