"""The flow both text endpoints share: parse, convert, classify, then the gateway's request path, the
reply read whole or streamed as Server-Sent Events.

A streamed request reads its first response before answering, so a request refused before any token
(unknown model, overloaded, no worker) gets its proper HTTP status rather than a 200 stream that
carries an error; after that, errors travel in the stream.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from hanzo.inference.v1 import inference_pb2
from services.gateway.classify import classify_generate
from services.gateway.openai import chat, completions
from services.gateway.openai.auto_tool_stream import AutoToolText
from services.gateway.openai.front import Front
from services.gateway.openai.sampling import include_usage
from services.gateway.openai.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from services.gateway.openai.streaming import Chunks, Outcome, PlainText, SSEResponse, collect, events
from services.gateway.openai.tool_stream import ForcedCallText

REQUEST_ID_HEADER = "x-request-id"


@dataclass(frozen=True)
class TextRoute:
    """One text endpoint: its metrics method, body schema and conversions."""

    method: str  # the method its requests are counted under, as over gRPC
    schema: type[SamplingFields]
    to_generate: Callable[[Any], inference_pb2.GenerateRequest]
    fill_default_budget: Callable[[inference_pb2.GenerateRequest], None]
    reply: Callable[[list[Outcome], str, int, Any], BaseModel]  # (a choice's each, request id, created, body)
    chunks: Callable[[str, int, str], Chunks]


CHAT = TextRoute(
    "Chat", ChatCompletionRequest, chat.to_generate, chat.fill_default_budget, chat.reply, chat.chunks
)
COMPLETIONS = TextRoute(
    "Generate",
    CompletionRequest,
    completions.to_generate,
    completions.fill_default_budget,
    completions.reply,
    completions.chunks,
)


async def generate(front: Front, route: TextRoute, request: Request) -> Response:
    """The reply to one chat or completion request (typed errors raised, answered by Front.respond)."""
    started = time.monotonic()  # TTFT as the caller sees it, from arrival
    body = await front.parse(request, route.schema)
    message = route.to_generate(body)
    # Always the gateway's own id: a client's x-request-id is echoed, never used as the engine's key
    # (two clients sending the same one must not collide on a worker).
    message.request_id = request_id = front.router.new_request_id()
    workload = classify_generate(message, front.workload_metadata(request))
    route.fill_default_budget(message)
    deadline = front.deadline(request)
    stream = front.router.generate(message, workload, deadline, started, front.tallies[route.method])
    created = int(time.time())
    headers = {REQUEST_ID_HEADER: request.headers.get(REQUEST_ID_HEADER) or request_id}
    if not body.stream:
        outcomes = await front.guarded(request, collect(stream), deadline)
        reply = route.reply(outcomes, request_id, created, body)
        return Response(reply.model_dump_json(), 200, headers, "application/json")
    first = await front.guarded(request, anext(stream), deadline)
    writer = route.chunks(request_id, created, body.model)
    choice = chat.holds_calls(body) if route is CHAT else None
    choices = message.sampling.n or 1
    if choice is None:
        text_of: Callable[[], PlainText] = PlainText
    elif choice == "auto":  # content streams until a call begins; calls come whole, in the delta shape
        text_of = AutoToolText
    else:  # a forced call is sent once whole, in OpenAI's delta shape
        text_of = functools.partial(ForcedCallText, choice)
    sse = events(first, stream, writer, include_usage(body), deadline, choices, text_of)
    return SSEResponse(sse, stream, headers={**headers, "cache-control": "no-cache"})
