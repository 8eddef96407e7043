"""GenerateStreams: many Generate streams multiplexed on one long-lived call (as Triton's
ModelStreamInfer). The gateway keeps one such call per worker, so a request costs one message each way
instead of a gRPC call set up at both ends: on this machine that took about a quarter of a millisecond
off the time to first token the gateway adds (bench/mesh.py).

Each stream runs as its own task through the same code as a Generate call, with its own deadline and
server span (continuing the trace context it carries); its events go back in batches: whatever is ready
when the call can send goes in one message, so a busy worker sends fewer, larger messages.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable

import grpc
from opentelemetry import trace

from hanzo.inference.v1 import inference_pb2, worker_pb2
from services.common.error_status import ErrorStatus
from services.common.retry_info import status_details
from services.common.served import record_status, server_span
from services.common.tracing import rpc_attributes
from services.worker.server.error_status import worker_status

# One request's responses, as a Generate call streams them: (request, deadline as time.monotonic()).
Generate = Callable[
    [inference_pb2.GenerateRequest, float | None], AsyncIterator[inference_pb2.GenerateResponse]
]

log = logging.getLogger(__name__)

_SPAN_NAME = "/hanzo.inference.v1.Worker/Generate"  # a stream reads in a trace as a Generate call does
_SPAN_ATTRIBUTES = rpc_attributes("hanzo.inference.v1.Worker", "Generate")
_MAX_BATCH = 256  # events per message: bounds one message's size under a backlog


class StreamSession:
    """One GenerateStreams call: a task per stream started on it, their events sent back in batches.

    The call ends when the caller has stopped writing, or the worker is draining, and every stream has
    ended; a cancelled call (the caller went away) cancels its streams, which aborts their requests."""

    def __init__(
        self, generate: Generate, node_id: str, draining: Callable[[], bool], tracer: trace.Tracer
    ) -> None:
        """generate: the servicer's request path; draining: whether the worker refuses new streams."""
        self.generate = generate
        self.node_id = node_id
        self.draining = draining
        self.tracer = tracer
        self._streams: dict[int, asyncio.Task[None]] = {}
        self._events: asyncio.Queue[worker_pb2.StreamEvent | None] = asyncio.Queue()  # None: look again
        self._reading = True

    def wake(self) -> None:
        """Look again whether the call may end (the worker started draining)."""
        self._events.put_nowait(None)

    async def run(
        self, requests: AsyncIterator[worker_pb2.StreamRequest]
    ) -> AsyncIterator[worker_pb2.StreamEvents]:
        reader = asyncio.create_task(self._read(requests), name="stream-requests")
        try:
            while True:
                event = await self._events.get()
                events = [] if event is None else [event]
                while len(events) < _MAX_BATCH and not self._events.empty():
                    more = self._events.get_nowait()
                    if more is not None:
                        events.append(more)
                if events:
                    yield worker_pb2.StreamEvents(events=events)
                if self._ended():
                    return
        finally:
            reader.cancel()
            for task in list(self._streams.values()):
                task.cancel()  # the caller is gone: abort what it started, freeing the KV at once

    def _ended(self) -> bool:
        return (not self._reading or self.draining()) and not self._streams and self._events.empty()

    async def _read(self, requests: AsyncIterator[worker_pb2.StreamRequest]) -> None:
        try:
            async for message in requests:
                action = message.WhichOneof("action")
                if action == "start":
                    self._start(message.stream_id, message.start)
                elif action == "cancel":
                    task = self._streams.get(message.stream_id)
                    if task is not None:  # else it has ended already: nothing to stop
                        task.cancel()
                else:
                    why = "a StreamRequest needs start or cancel set"
                    self._end(message.stream_id, grpc.StatusCode.INVALID_ARGUMENT, why)
        except grpc.aio.AioRpcError:
            pass  # the call broke: run()'s caller is cancelled too, and cleans up
        finally:
            self._reading = False
            self.wake()

    def _start(self, stream_id: int, start: worker_pb2.StreamStart) -> None:
        if self.draining():
            self._end(stream_id, grpc.StatusCode.UNAVAILABLE, f"worker {self.node_id} is draining")
        elif stream_id in self._streams:
            self._end(
                stream_id, grpc.StatusCode.INVALID_ARGUMENT, f"stream_id {stream_id} is in use on this call"
            )
        elif not (math.isfinite(start.timeout_s) and start.timeout_s >= 0):
            why = f"timeout_s must be a finite number of seconds >= 0 (0: none), got {start.timeout_s}"
            self._end(stream_id, grpc.StatusCode.INVALID_ARGUMENT, why)
        else:
            task = asyncio.create_task(self._serve(stream_id, start), name=f"stream-{stream_id}")
            self._streams[stream_id] = task

    async def _serve(self, stream_id: int, start: worker_pb2.StreamStart) -> None:
        timeout_s = start.timeout_s or None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with server_span(self.tracer, _SPAN_NAME, _SPAN_ATTRIBUTES, start.trace_context) as span:
            try:
                async with asyncio.timeout(timeout_s):
                    async for response in self.generate(start.request, deadline):
                        self._events.put_nowait(
                            worker_pb2.StreamEvent(stream_id=stream_id, response=response)
                        )
                code, details, retry_after_s = grpc.StatusCode.OK, "", None
            except asyncio.CancelledError:
                record_status(span, grpc.StatusCode.CANCELLED, "the caller cancelled")
                self._streams.pop(stream_id, None)
                self.wake()
                raise
            except TimeoutError:
                code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "the caller's deadline passed"
                retry_after_s = None
            except Exception as exc:
                mapped = worker_status(exc)
                if mapped is None:  # a bug: answered UNKNOWN with its text, as a Generate call would be
                    log.exception("stream %d failed", stream_id)
                    span.record_exception(exc)
                    mapped = ErrorStatus(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
                code, details, retry_after_s = mapped
            record_status(span, code, details)
        self._streams.pop(stream_id, None)
        self._end(stream_id, code, details, retry_after_s)

    def _end(
        self, stream_id: int, code: grpc.StatusCode, details: str, retry_after_s: float | None = None
    ) -> None:
        end = worker_pb2.StreamEnd(code=code.value[0], details=details)
        if retry_after_s is not None:  # as a Generate call's grpc-status-details-bin trailer would carry it
            end.status_details = status_details(code, details, retry_after_s)
        self._events.put_nowait(worker_pb2.StreamEvent(stream_id=stream_id, end=end))
