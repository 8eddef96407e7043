"""A streamed chat reply that is a forced tool call (tool_choice "required" or a named function), sent
once it is whole: the call's JSON comes back parsed, not as content (auto_tool_stream.py streams "auto").
The chunks are OpenAI's, choice by choice: the role, then either the content or the calls (each with its
index, id, type, name and whole arguments), then the finish reason; then the usage if asked for, and
[DONE]; an error after the stream began is sent in-band, as streaming.events does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from hanzo.inference.v1 import inference_pb2
from services.gateway.openai import tool_calls
from services.gateway.openai.streaming import Chunks, Outcome, collect, framed, total_usage
from services.gateway.router import Deadline


async def whole_events(
    first: inference_pb2.GenerateResponse,
    stream: AsyncIterator[inference_pb2.GenerateResponse],
    chunks: Chunks,
    include_usage: bool,
    deadline: Deadline,
    ended: Callable[[], None],
    choice: str,
) -> AsyncIterator[str]:
    """The SSE text of a reply read whole (first already read), its tool calls parsed under choice."""

    async def body() -> AsyncIterator[str]:
        outcomes = await _read_rest(first, stream, deadline.time_remaining())
        for index, outcome in enumerate(outcomes):
            parsed = tool_calls.parse(outcome.text, choice)
            opening = chunks.opening(index)
            if opening is not None:
                yield opening
            calls = [call_delta(i, call) for i, call in enumerate(parsed.calls)]
            if calls:
                yield chunks.raw_delta({"tool_calls": calls}, index, outcome.logprobs)
            elif parsed.content or outcome.logprobs:
                yield chunks.delta(parsed.content or "", None, None, index, outcome.logprobs)
            reason = "tool_calls" if calls and outcome.finish_reason == "stop" else outcome.finish_reason
            yield chunks.delta("", reason, outcome.stop_reason, index)
        if include_usage:
            yield chunks.usage(total_usage(o.usage for o in outcomes))

    async for event in framed(body(), stream, ended):
        yield event


async def _read_rest(
    first: inference_pb2.GenerateResponse,
    stream: AsyncIterator[inference_pb2.GenerateResponse],
    remaining: float | None,
) -> list[Outcome]:
    async def chained() -> AsyncIterator[inference_pb2.GenerateResponse]:
        yield first
        async for response in stream:  # the stream ends after the last choice's last response
            yield response

    async with asyncio.timeout(remaining):  # a backstop: the worker ends the stream at the deadline
        return await collect(chained())


def call_delta(index: int, call: tool_calls.Call) -> dict[str, object]:
    function = {"name": call.name, "arguments": call.arguments}
    return {"index": index, "id": call.id, "type": "function", "function": function}
