"""The gateway's side of Placer.PickStream: one long-lived call carries every pick a remote gateway asks
for (see services/placer/pick_stream.py for why).

A pick reads like a Pick call: it returns the PickReply or raises grpc.aio.AioRpcError with the status
the call would have ended with, so the gateway's handling of the placer's statuses is unchanged. Picks
asked for while a message is being written go together in the next one. A call that breaks (the placer
restarted or stopped) fails each pick waiting on it with UNAVAILABLE; the next pick opens a new call.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping

import grpc

from hanzo.inference.v1 import placer_pb2, placer_pb2_grpc
from services.common.internal_auth import Metadata
from services.common.multiplexed import read_until_ended, rpc_error, status_code
from services.placer.pick_stream import MAX_CALLS


class _PickCall:
    """One PickStream call and the picks waiting on it.

    One writer task sends every message: grpc.aio allows one write in flight per call, and a write
    cancelled midway cancels the whole call, so a caller that goes away must never be the one writing."""

    def __init__(self, stub: placer_pb2_grpc.PlacerStub, metadata: Metadata) -> None:
        self.call = stub.PickStream(metadata=metadata)
        self.broken = False
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[placer_pb2.PickAnswer]] = {}
        self._outbox: list[placer_pb2.PickCall] = []
        self._ready = asyncio.Event()
        self._writer = asyncio.create_task(self._write(), name="placer-link-writer")
        self._reader = asyncio.create_task(self._read(), name="placer-link-reader")

    async def pick(
        self, request: placer_pb2.PickRequest, timeout_s: float | None, trace_context: Mapping[str, str]
    ) -> placer_pb2.PickReply:
        call_id = next(self._ids)
        answer: asyncio.Future[placer_pb2.PickAnswer] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = answer
        call = placer_pb2.PickCall(call_id=call_id, request=request, trace_context=trace_context)
        self._outbox.append(call)
        self._ready.set()
        try:
            async with asyncio.timeout(timeout_s):
                answered = await answer
        except TimeoutError:
            why = f"the placer did not answer a pick within the caller's {timeout_s:.3g} s"
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, why) from None
        finally:
            self._waiting.pop(call_id, None)  # cancelled or timed out: a late answer is dropped
        if answered.HasField("failure"):
            raise rpc_error(status_code(answered.failure.code), answered.failure.details)
        return answered.reply

    async def close(self) -> None:
        self.broken = True
        self.call.cancel()
        await asyncio.gather(self._reader, self._writer, return_exceptions=True)

    async def _write(self) -> None:
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                while self._outbox:
                    calls, self._outbox = self._outbox[:MAX_CALLS], self._outbox[MAX_CALLS:]
                    await self.call.write(placer_pb2.PickCalls(calls=calls))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            self.call.cancel()  # the call is over: the reader sees it end and fails the waiting picks

    def _deliver(self, answers: placer_pb2.PickAnswers) -> None:
        for answer in answers.answers:
            waiting = self._waiting.get(answer.call_id)
            if waiting is not None and not waiting.done():
                waiting.set_result(answer)

    async def _read(self) -> None:
        reason = "the placer ended the call"
        try:
            reason = await read_until_ended(self.call, self._deliver, reason)
        finally:
            self.broken = True
            self._writer.cancel()
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"pick stream to the placer broke ({reason})")
            for waiting in self._waiting.values():
                if not waiting.done():
                    waiting.set_exception(error)
            self._waiting.clear()


class PlacerLink:
    """Picks over one PickStream call to the placer, replaced when it breaks."""

    def __init__(self, stub: placer_pb2_grpc.PlacerStub, metadata: Metadata = ()) -> None:
        """metadata: sent when a PickStream call opens (the internal token)."""
        self._stub = stub
        self._metadata = metadata
        self._call: _PickCall | None = None

    async def pick(
        self,
        request: placer_pb2.PickRequest,
        timeout_s: float | None,
        trace_context: Mapping[str, str],
    ) -> placer_pb2.PickReply:
        """The placer's answer to request, as a Pick call returns it (grpc.aio.AioRpcError for a status
        but OK); timeout_s: how long to wait for it (None: no limit); trace_context: W3C headers of the
        caller's span, for the placer's span of this pick (empty: none)."""
        if self._call is None or self._call.broken:
            self._call = _PickCall(self._stub, self._metadata)
        return await self._call.pick(request, timeout_s, trace_context)

    async def close(self) -> None:
        if self._call is not None:
            await self._call.close()
