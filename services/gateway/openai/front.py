"""What every HTTP route of the OpenAI-compatible front shares: the API-key check, the body read within
its size limit and parsed, the request's deadline, the caller's trace continued, the client's disconnect
watched, and typed errors answered in OpenAI's shape. The request path itself is the gateway's router.
The SERVER span of a request is OpenTelemetry's ASGI instrumentation's (app.py), when spans record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from opentelemetry import context, trace
from opentelemetry.propagate import extract
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from services.common.served import Authenticate
from services.common.tracing import records_spans
from services.gateway.classify import METADATA_KEY
from services.gateway.config import GatewaySettings
from services.gateway.metrics import HTTP, GatewayMetrics, Tally
from services.gateway.openai.errors import HttpError, from_exception, from_validation
from services.gateway.openai.streaming import SSEResponse
from services.gateway.router import DeadlineExceeded, Router, Timeout

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
TIMEOUT_HEADER = "timeout"  # seconds; it can only shorten the server's own cap (http_timeout_s)
_TRACEPARENT = "traceparent"


class ClientGone(Exception):
    """The client disconnected before its reply was ready; nobody reads the answer."""


class Front:
    """The shared pieces, built once per gateway; routes (app.py) call them per request."""

    def __init__(
        self,
        router: Router,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
        tracer: trace.Tracer,
        authenticate: Authenticate | None,
    ) -> None:
        self.router = router
        self.settings = settings
        self.metrics = metrics
        self.tracer = tracer
        self.recording = records_spans(tracer)
        self.authenticate = authenticate
        self.serving = True  # False once the gateway stops: /health answers 503
        self.started = int(time.time())  # the `created` of every model card
        self.tallies: dict[str, Tally] = {m: metrics.tally(m, HTTP) for m in ("Generate", "Chat", "Embed")}

    async def respond(
        self, route: str, request: Request, handler: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """handler's response, or the OpenAI error for what it raised; counted, and traced as part of
        the caller's trace (W3C traceparent) whether or not this gateway records spans."""
        started = time.perf_counter()
        in_flight = self.metrics.http_in_flight.labels(route)
        in_flight.inc()
        continued = self._continue_trace(request.headers)
        try:
            response = await handler(request)
        except ClientGone:
            response = Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        except Exception as exc:
            error = from_exception(exc)
            response = Response(error.json(), error.status, error.headers, "application/json")
        finally:
            if continued is not None:
                context.detach(continued)
        status = str(response.status_code)
        self.metrics.http_responses.labels(route, status).inc()

        def done() -> None:
            in_flight.dec()
            self.metrics.http_seconds.labels(route, status).observe(time.perf_counter() - started)

        if isinstance(response, SSEResponse):
            response.on_close = done  # a stream is answered when its last event is out
        else:
            done()
        return response

    def authorize(self, request: Request) -> None:
        """Unauthenticated (401) unless the request carries `Authorization: Bearer <a known key>`;
        ResourceExhausted (429 with Retry-After) when that key is over its rate limit."""
        if self.authenticate is not None:
            self.authenticate(request.headers)

    async def parse(self, request: Request, schema: type[M]) -> M:
        """The authorized request's body as schema; 413 past the size limit, 400 naming a bad field."""
        self.authorize(request)
        limit = self.settings.http_max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        try:
            return schema.model_validate_json(b"".join(chunks))
        except ValidationError as err:
            raise from_validation(err) from None

    def deadline(self, request: Request) -> Timeout:
        """The request's time: the `timeout` header (seconds) when set, never past http_timeout_s."""
        cap = self.settings.http_timeout_s
        raw = request.headers.get(TIMEOUT_HEADER)
        if raw is None:
            return Timeout(cap)
        try:
            asked = float(raw)
        except ValueError:
            asked = -1.0
        if not asked > 0:
            raise HttpError(400, f"{TIMEOUT_HEADER}: must be seconds > 0, got {raw!r}", param=TIMEOUT_HEADER)
        return Timeout(min(asked, cap))

    @staticmethod
    def workload_metadata(request: Request) -> tuple[tuple[str, str], ...] | None:
        """The `x-hanzo-workload` header as the classifier reads gRPC metadata."""
        named = request.headers.get(METADATA_KEY)
        return ((METADATA_KEY, named),) if named is not None else None

    async def guarded(self, request: Request, work: Awaitable[T], deadline: Timeout) -> T:
        """work's result, unless the client disconnects (ClientGone) or the deadline passes (504) first;
        either cancels work, and with it the worker's stream, at once."""
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(_disconnected(request.receive))
        try:
            done, _ = await asyncio.wait(
                (task, watch), timeout=deadline.time_remaining(), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            watch.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)  # its cleanup (the link's cancel) ran
        if task in done:
            return task.result()
        if watch in done:
            raise ClientGone
        raise DeadlineExceeded("the request's time ran out before the reply was complete")

    def _continue_trace(self, headers: Mapping[str, str]) -> object | None:
        """Where nothing records there is no ASGI span to carry a caller's trace: its context is made
        current for the handler, so the worker's spans (if its gateway's peers record) join that trace.
        The token to detach, None when there was nothing to do. The router reads the stream's first
        response inside the handler, so every worker call starts under this context."""
        if self.recording or _TRACEPARENT not in headers:
            return None
        return context.attach(extract(headers))


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has gone (the body is read: receive only reports the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _too_large(limit: int) -> HttpError:
    return HttpError(413, f"the request body is over {limit} bytes", code="request_too_large")
