"""Server-Sent Events in OpenAI's stream shape, and the outcome of a generation read whole.

A stream is `data: {chunk}\\n\\n` per delta, a chunk with finish_reason, with include_usage a chunk with
empty choices and the usage, then `data: [DONE]\\n\\n`. An error after the stream began is sent as a
`data: {"error": {...}}` event before [DONE] (as vLLM does). Chunks are formatted from a prefix made
once per stream, so a token costs one json.dumps of its text rather than a model dump.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Send

from hanzo.inference.v1 import inference_pb2
from services.gateway.openai.errors import HttpError, from_exception
from services.gateway.openai.logprobs import Entries, chat_logprobs, completion_logprobs
from services.gateway.openai.schemas import PromptTokensDetails, Usage
from services.gateway.router import Deadline, DeadlineExceeded

FINISH_REASONS = {
    inference_pb2.FINISH_REASON_STOP: "stop",
    inference_pb2.FINISH_REASON_LENGTH: "length",
    inference_pb2.FINISH_REASON_ABORT: "abort",  # vLLM passes the engine's "abort" on as it is
    inference_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}
DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class Outcome:
    """One finished choice: its whole text, finish reason, usage, stop reason and per-token logprobs."""

    text: str
    finish_reason: str | None
    usage: inference_pb2.Usage
    stop_reason: str | int | None = None
    logprobs: list[inference_pb2.TokenLogprobs] = field(default_factory=list)


def stop_reason(response: inference_pb2.GenerateResponse) -> str | int | None:
    """The stop string or stop token id that ended a generation (vLLM's stop_reason); None for an EOS
    id, a length cut or an unfinished one."""
    which = response.WhichOneof("stop_reason")
    return None if which is None else getattr(response, which)


async def collect(stream: AsyncIterator[inference_pb2.GenerateResponse]) -> list[Outcome]:
    """Read a generation to its end: one Outcome per choice, in index order."""
    texts: dict[int, list[str]] = {}
    logprobs: dict[int, list[inference_pb2.TokenLogprobs]] = {}
    last: dict[int, inference_pb2.GenerateResponse] = {}
    async for response in stream:
        index = response.index
        texts.setdefault(index, []).append(response.text)
        logprobs.setdefault(index, []).extend(response.logprobs)
        last[index] = response
    if not last:
        last[0] = inference_pb2.GenerateResponse()
    return [
        Outcome(
            "".join(texts.get(i, ())),
            FINISH_REASONS.get(end.finish_reason),
            end.usage,
            stop_reason(end),
            logprobs.get(i, []),
        )
        for i, end in sorted(last.items())
    ]


def total_usage(usages: Iterable[inference_pb2.Usage]) -> inference_pb2.Usage:
    """A request's usage over its choices: the prompt once (each choice reports it), the outputs summed."""
    total = inference_pb2.Usage()
    for usage in usages:
        total.prompt_tokens = max(total.prompt_tokens, usage.prompt_tokens)
        total.cached_prompt_tokens = max(total.cached_prompt_tokens, usage.cached_prompt_tokens)
        total.completion_tokens += usage.completion_tokens
    return total


def usage_of(usage: inference_pb2.Usage) -> Usage:
    return Usage.model_construct(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=PromptTokensDetails.model_construct(cached_tokens=usage.cached_prompt_tokens),
    )


class Chunks:
    """The chunks of one stream: chat.completion.chunk deltas (chat) or text_completion texts, each for
    one choice (its index), with that choice's logprobs when asked for."""

    def __init__(self, id_: str, object_: str, created: int, model: str, chat: bool) -> None:
        fields = {"id": id_, "object": object_, "created": created, "model": model}
        self._head = "data: " + json.dumps(fields, separators=(",", ":"))[:-1]
        self.chat = chat
        self._choices: dict[int, str] = {}
        self._usage = self._head + ',"choices":[],"usage":'
        self._text_offsets: dict[int, int] = {}  # per choice, for the legacy logprobs' text_offset

    def _choice(self, index: int) -> str:
        prefix = self._choices.get(index)
        if prefix is None:
            opening = f',"choices":[{{"index":{index},' + ('"delta":' if self.chat else '"text":')
            prefix = self._choices[index] = self._head + opening
        return prefix

    def opening(self, index: int = 0) -> str | None:
        """A choice's first chunk: a chat stream names the assistant role before any text (as OpenAI's)."""
        if not self.chat:
            return None
        return (
            self._choice(index)
            + '{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def delta(
        self,
        text: str,
        finish_reason: str | None,
        stop: str | int | None = None,
        index: int = 0,
        logprobs: Entries = (),
    ) -> str:
        """A text delta; the last one carries finish_reason and vLLM's stop_reason."""
        reason = f'"{finish_reason}"' if finish_reason else "null"
        if finish_reason:
            reason += ',"stop_reason":' + json.dumps(stop)
        tail = ',"logprobs":' + self._logprobs(index, logprobs) + ',"finish_reason":' + reason + "}]}\n\n"
        if not self.chat:
            return self._choice(index) + json.dumps(text) + tail
        body = '{"content":' + json.dumps(text) + "}" if text else "{}"
        return self._choice(index) + body + tail

    def raw_delta(self, delta: dict[str, object], index: int = 0, logprobs: Entries = ()) -> str:
        """A chat chunk carrying delta as given (tool_calls)."""
        return (
            self._choice(index)
            + json.dumps(delta, separators=(",", ":"))
            + ',"logprobs":'
            + self._logprobs(index, logprobs)
            + ',"finish_reason":null}]}\n\n'
        )

    def usage(self, usage: inference_pb2.Usage) -> str:
        return self._usage + usage_of(usage).model_dump_json() + "}\n\n"

    def _logprobs(self, index: int, entries: Entries) -> str:
        if not entries:
            return "null"
        if self.chat:
            shape = chat_logprobs(entries)
        else:
            shape, self._text_offsets[index] = completion_logprobs(entries, self._text_offsets.get(index, 0))
        return json.dumps(shape, separators=(",", ":"))


class PlainText:
    """What a choice's stream sends as it comes: every delta as it is, nothing held for the end. The
    shape of the hook events() takes per choice (auto_tool_stream.AutoToolText holds tool calls back)."""

    def content(self, delta: str) -> str:
        return delta

    def rest(self) -> tuple[str, list[dict[str, object]]]:
        """At the choice's end: text not yet sent, and the tool_calls deltas to send."""
        return "", []


async def events(
    first: inference_pb2.GenerateResponse,
    stream: AsyncIterator[inference_pb2.GenerateResponse],
    chunks: Chunks,
    include_usage: bool,
    deadline: Deadline,
    choices: int = 1,
    text_of: Callable[[], PlainText] = PlainText,
) -> AsyncIterator[str]:
    """The SSE text of a stream of `choices` choices whose first response is already read; it ends once
    each choice has finished. deadline: a backstop for a worker that stops answering (the worker ends the
    stream at the deadline itself). text_of:
    each choice's text hook (PlainText's shape). Closing this iterator (the client went away) closes
    stream, which cancels the worker's."""

    async def deltas() -> AsyncIterator[str]:
        response = first
        remaining = deadline.time_remaining()
        deadline_at = asyncio.get_running_loop().time() + (remaining if remaining is not None else 1e9)
        texts: dict[int, PlainText] = {}
        usages: dict[int, inference_pb2.Usage] = {}
        while True:
            index = response.index
            text_state = texts.get(index)
            if text_state is None:
                text_state = texts[index] = text_of()
                opening = chunks.opening(index)
                if opening is not None:
                    yield opening
            text = text_state.content(response.text)
            reason = FINISH_REASONS.get(response.finish_reason)
            if not reason:
                if text or response.logprobs:
                    yield chunks.delta(text, None, None, index, response.logprobs)
            else:
                rest, calls = text_state.rest()
                stop = stop_reason(response)
                if calls:  # the content first, then the calls, then the finish reason
                    if text + rest or response.logprobs:
                        yield chunks.delta(text + rest, None, None, index, response.logprobs)
                    yield chunks.raw_delta({"tool_calls": calls}, index)
                    yield chunks.delta("", reason, stop, index)
                else:
                    yield chunks.delta(text + rest, reason, stop, index, response.logprobs)
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

    async for event in framed(deltas(), stream):
        yield event


async def framed(
    body: AsyncIterator[str],
    stream: AsyncIterator[inference_pb2.GenerateResponse],
) -> AsyncIterator[str]:
    """body's events, then an in-band error event if it raised (a timeout as DEADLINE_EXCEEDED), then
    [DONE]. However it ends, even closed by a client that went away, body and stream are closed (which
    cancels the worker's stream)."""
    error: HttpError | None = None
    try:
        async for event in body:
            yield event
    except TimeoutError:
        error = from_exception(DeadlineExceeded("the request's time ran out while streaming"))
    except Exception as exc:  # typed errors and bugs alike: the stream has begun, so say it in-band
        error = from_exception(exc)
    finally:
        await body.aclose()  # type: ignore[attr-defined]
        await stream.aclose()  # type: ignore[attr-defined]  # the router's stream is an async generator
    if error is not None:
        yield f"data: {error.json()}\n\n"
    yield DONE


class SSEResponse(StreamingResponse):
    """A text/event-stream response that closes its event iterator, and the generation behind it,
    however the response ends.

    Starlette cancels a stream whose client disconnected; when that lands while the response is
    writing (outside the iterator), or before the iterator ever ran (so its own cleanup never runs),
    the generation would go on until garbage-collected. Closing both here cancels the worker's stream
    at once. source: the router's stream the events read (closing it twice is harmless)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        content: AsyncIterator[str],
        source: AsyncIterator[inference_pb2.GenerateResponse],
        headers: Mapping[str, str],
    ) -> None:
        super().__init__(content, headers=headers)
        self._source = source
        self.on_close: Callable[[], None] | None = None  # called once the response has ended, however

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                await self._source.aclose()  # type: ignore[attr-defined]
            if self.on_close is not None:
                self.on_close()
                self.on_close = None
