"""The gateway's side of Worker.GenerateStreams: one long-lived call per worker carries every Generate
stream the gateway sends there (see services/worker/server/streams.py for why).

A stream reads like a Generate call: it iterates GenerateResponse messages and ends with
grpc.aio.AioRpcError for any status but OK, so the gateway's retry rules (retry only before the first
token) apply unchanged. A link that breaks (the worker died, or finished draining) ends each of its
streams with UNAVAILABLE; the next request opens a new call.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping

import grpc

from hanzo.inference.v1 import inference_pb2, worker_pb2, worker_pb2_grpc
from services.common.internal_auth import Metadata
from services.common.multiplexed import read_until_ended, rpc_error, status_code


class LinkBroken(grpc.aio.AioRpcError):
    """UNAVAILABLE for every stream of a link that broke: the worker died, hung past its keepalive, or
    closed the call; the gateway leaves such a worker out of its picks for a while (ejections.py)."""


class LinkStream:
    """One Generate stream on a link: iterate it for the responses; cancel() when done with it."""

    def __init__(self, call: _LinkCall, stream_id: int) -> None:
        self._call = call
        self.stream_id = stream_id
        self._events: asyncio.Queue[worker_pb2.StreamEvent | grpc.aio.AioRpcError] = asyncio.Queue()
        self._ended = False

    def __aiter__(self) -> LinkStream:
        return self

    async def __anext__(self) -> inference_pb2.GenerateResponse:
        if self._ended:
            raise StopAsyncIteration
        event = await self._events.get()
        if isinstance(event, grpc.aio.AioRpcError):
            self._ended = True
            raise event
        if event.HasField("response"):
            return event.response
        self._ended = True
        self._call.forget(self.stream_id)
        if event.end.code == grpc.StatusCode.OK.value[0]:
            raise StopAsyncIteration
        raise rpc_error(status_code(event.end.code), event.end.details, event.end.status_details)

    def cancel(self) -> None:
        """Stop the stream: the worker aborts its request and frees its KV. Nothing to do once ended."""
        if not self._ended:
            self._ended = True
            self._call.cancel(self.stream_id)

    def deliver(self, event: worker_pb2.StreamEvent | grpc.aio.AioRpcError) -> None:
        self._events.put_nowait(event)


class _LinkCall:
    """One GenerateStreams call and the streams started on it.

    One writer task sends every message, in order: grpc.aio allows one write in flight per call, and a
    write cancelled midway cancels the whole call, so a caller that goes away while its start is being
    written must never be the one writing it."""

    def __init__(self, stub: worker_pb2_grpc.WorkerStub, address: str, metadata: Metadata = ()) -> None:
        self.address = address
        self.call = stub.GenerateStreams(metadata=metadata)
        self.streams: dict[int, LinkStream] = {}
        self.broken = False
        self._ids = itertools.count(1)
        self._outbox: asyncio.Queue[worker_pb2.StreamRequest] = asyncio.Queue()
        self._writer = asyncio.create_task(self._write(), name=f"link-writer-{address}")
        self._reader = asyncio.create_task(self._read(), name=f"link-reader-{address}")

    def start(
        self,
        request: inference_pb2.GenerateRequest,
        timeout_s: float | None,
        trace_context: Mapping[str, str],
    ) -> LinkStream:
        stream = LinkStream(self, next(self._ids))
        self.streams[stream.stream_id] = stream
        start = worker_pb2.StreamStart(
            request=request, timeout_s=timeout_s or 0.0, trace_context=trace_context
        )
        self._outbox.put_nowait(worker_pb2.StreamRequest(stream_id=stream.stream_id, start=start))
        return stream

    def forget(self, stream_id: int) -> None:
        self.streams.pop(stream_id, None)

    def cancel(self, stream_id: int) -> None:
        """Ask the worker to stop a stream (it aborts the request); a broken call needs no asking: the
        worker cancels every stream of a call that ends."""
        if self.streams.pop(stream_id, None) is not None and not self.broken:
            self._outbox.put_nowait(
                worker_pb2.StreamRequest(stream_id=stream_id, cancel=worker_pb2.StreamCancel())
            )

    async def close(self) -> None:
        self.broken = True
        self.call.cancel()
        self._writer.cancel()
        await asyncio.gather(self._reader, self._writer, return_exceptions=True)

    async def _write(self) -> None:
        try:
            while True:
                await self.call.write(await self._outbox.get())
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            self.call.cancel()  # the call is over: the reader sees it end and fails its streams

    def _deliver(self, batch: worker_pb2.StreamEvents) -> None:
        for event in batch.events:
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.deliver(event)

    async def _read(self) -> None:
        reason = "closed the link"  # the worker drained: it ended the call once its streams were done
        try:
            reason = await read_until_ended(self.call, self._deliver, reason)
        finally:
            self.broken = True
            self._writer.cancel()
            why = f"link to worker {self.address} broke ({reason})"
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, why, kind=LinkBroken)
            for stream in self.streams.values():
                stream.deliver(error)
            self.streams.clear()


class WorkerLink:
    """Generate streams to one worker over one GenerateStreams call, replaced when it breaks."""

    def __init__(self, stub: worker_pb2_grpc.WorkerStub, address: str, metadata: Metadata = ()) -> None:
        """metadata: sent when a GenerateStreams call opens (the internal token)."""
        self._stub = stub
        self._address = address
        self._metadata = metadata
        self._call: _LinkCall | None = None

    def start(
        self,
        request: inference_pb2.GenerateRequest,
        timeout_s: float | None,
        trace_context: Mapping[str, str],
    ) -> LinkStream:
        """A new stream for request, sent without waiting; a link that cannot carry it ends the stream
        with UNAVAILABLE (grpc.aio.AioRpcError) when iterated."""
        if self._call is None or self._call.broken:
            self._call = _LinkCall(self._stub, self._address, self._metadata)
        return self._call.start(request, timeout_s, trace_context)

    async def close(self) -> None:
        if self._call is not None:
            await self._call.close()
