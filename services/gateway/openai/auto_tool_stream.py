"""A streamed chat reply under tool_choice "auto": its text streams as content until a `<tool_call>` tag
begins, and what follows the tag is held until the choice ends, then sent as OpenAI's tool_calls delta
(each call with its index, id, type, name and whole arguments). Text that could still turn out to be the
start of the tag is held back, so a tag is never half-sent as content; a reply that never calls a tool
streams like any other. Each choice (n > 1) keeps its own state; the finish reason is the worker's
(tool_calls when it found calls in the whole reply); then the usage if asked for, and [DONE]."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from hanzo.inference.v1 import inference_pb2
from services.common.tool_calls import OPEN_TAG, parse
from services.gateway.openai.streaming import FINISH_REASONS, Chunks, framed, stop_reason, total_usage
from services.gateway.openai.tool_stream import call_delta
from services.gateway.router import Deadline


class _Choice:
    """One choice's text: what was sent as content, and whether a call has begun."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0
        self.call_at: int | None = None  # where the first <tool_call> tag starts

    def content(self, delta: str) -> str:
        """The content to send now after delta arrives: up to a tag, and never a possible tag's start."""
        self.text += delta
        if self.call_at is not None:
            return ""
        found = self.text.find(OPEN_TAG, max(0, self.sent - len(OPEN_TAG)))
        if found >= 0:
            self.call_at = found
            return self._take(found)
        return self._take(len(self.text) - _partial_tag(self.text))

    def rest(self) -> tuple[str, list[dict[str, object]]]:
        """At the end: the content not yet sent and the calls found after the tag."""
        if self.call_at is None:
            return self._take(len(self.text)), []
        parsed = parse(self.text[self.call_at :], "auto")
        if not parsed.calls:  # a tag but no well-formed call after all: it was content
            return self._take(len(self.text)), []
        self.sent = len(self.text)
        return parsed.content or "", [call_delta(i, call) for i, call in enumerate(parsed.calls)]

    def _take(self, upto: int) -> str:
        out = self.text[self.sent : upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return out


def _partial_tag(text: str) -> int:
    """How many trailing characters of text are the start of the tag (so must wait for more)."""
    for size in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-size:]):
            return size
    return 0


async def auto_events(
    first: inference_pb2.GenerateResponse,
    stream: AsyncIterator[inference_pb2.GenerateResponse],
    chunks: Chunks,
    include_usage: bool,
    deadline: Deadline,
    ended: Callable[[], None],
    choices: int = 1,
) -> AsyncIterator[str]:
    """The SSE text of an auto-tool reply of `choices` choices whose first response is already read."""

    async def body() -> AsyncIterator[str]:
        response = first
        remaining = deadline.time_remaining()
        deadline_at = asyncio.get_running_loop().time() + (remaining if remaining is not None else 1e9)
        states: dict[int, _Choice] = {}
        usages: dict[int, inference_pb2.Usage] = {}
        while True:
            index = response.index
            state = states.get(index)
            if state is None:
                state = states[index] = _Choice()
                opening = chunks.opening(index)
                if opening is not None:
                    yield opening
            text = state.content(response.text)
            reason = FINISH_REASONS.get(response.finish_reason)
            if text or response.logprobs:
                yield chunks.delta(text, None, None, index, response.logprobs)
            if reason:
                rest, calls = state.rest()
                if rest:
                    yield chunks.delta(rest, None, None, index)
                if calls:
                    yield chunks.raw_delta({"tool_calls": calls}, index)
                yield chunks.delta("", reason, stop_reason(response), index)
                usages[index] = response.usage
                if len(usages) == choices:
                    break
            try:
                async with asyncio.timeout_at(deadline_at):
                    response = await anext(stream)
            except StopAsyncIteration:
                break
        if include_usage:
            yield chunks.usage(total_usage(usages.values()))

    async for event in framed(body(), stream, ended):
        yield event
