"""The gateway's request path, the same for every transport: validate, pick a worker, forward, retry.

The gRPC servicer and the HTTP front both call it with plain inputs (the request message, its workload
class, a deadline) and get GenerateResponses or typed errors (services.common.errors) back, so the
retry rules live in one place. A request moves to another worker only while nothing has been sent to
the caller; after the first token a failure ends the stream with UNAVAILABLE saying how many tokens
were delivered, so no token is ever duplicated.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Protocol

import grpc
from opentelemetry import trace

from hanzo.inference.v1 import inference_pb2, worker_pb2
from services.common import genai_spans
from services.common.errors import ResourceExhausted, ServiceError, Unavailable
from services.common.retry_info import retry_after_of
from services.common.tracing import client_call_span, parent_span, record_rpc_error, records_spans
from services.common.workload import WorkloadClass
from services.gateway.config import GatewaySettings
from services.gateway.metrics import Tally, TenantTokens
from services.gateway.prefix_chain import NO_HINTS, PromptHints, hints_of
from services.gateway.upstream import Placement, Upstream, relay
from services.gateway.validate import validate_embed, validate_generate
from services.gateway.worker_link import LinkBroken

_WORKER = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
_WORKER_GENERATE = f"/{_WORKER}/Generate"
_WORKER_EMBED = f"/{_WORKER}/Embed"

# Worker failures after which another worker may succeed (as long as nothing was sent yet).
_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,  # the placer's view was a beat behind: the model just left that worker
    grpc.StatusCode.CANCELLED,  # the worker shut down under us
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}
_DEFAULT_RETRY_S = 1.0  # when an overloaded worker gave no hint of its own


class Deadline(Protocol):
    """What is left of the caller's time; grpc.aio.ServicerContext is one as it is (no wrapper per call)."""

    def time_remaining(self) -> float | None: ...


class Timeout:
    """A deadline timeout_s from now (None: none), for callers without a gRPC context (the HTTP front)."""

    __slots__ = ("at",)

    def __init__(self, timeout_s: float | None) -> None:
        self.at = None if timeout_s is None else time.monotonic() + timeout_s

    def time_remaining(self) -> float | None:
        return None if self.at is None else self.at - time.monotonic()


class DeadlineExceeded(Unavailable):
    """The caller's deadline passed (DEADLINE_EXCEEDED), before placing or while streaming."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Router:
    def __init__(
        self, settings: GatewaySettings, upstream: Upstream, tracer: trace.Tracer, tenant_tokens: TenantTokens
    ) -> None:
        self.settings = settings
        self.tenant_tokens = tenant_tokens
        self.upstream = upstream
        self.tracer = tracer
        self.recording = records_spans(tracer)
        # Ids for requests that came without one: unique per gateway process (random prefix) and per
        # request (counter), without a random draw each time.
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count()

    def new_request_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids):x}"

    def generate(
        self,
        request: inference_pb2.GenerateRequest,
        workload: WorkloadClass,
        deadline: Deadline,
        started: float,
        tally: Tally,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Stream request's responses from a worker (the first names the class and node); request is
        forwarded as it is with class and id filled in, so it must be the caller's own to change.
        started: time.monotonic() at arrival, for time to first token. Closing the iterator early
        (the caller went away) cancels the worker's stream, which frees its KV blocks. Recorded as a
        GenAI span (`chat llama`) around the picks and worker calls; unrecorded, the caller's trace
        context (the current span's) still reaches the worker."""
        if not self.recording:
            return self._generate(request, workload, deadline, started, tally, trace.get_current_span())
        return self._traced_generate(request, workload, deadline, started, tally)

    async def _traced_generate(
        self,
        request: inference_pb2.GenerateRequest,
        workload: WorkloadClass,
        deadline: Deadline,
        started: float,
        tally: Tally,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        operation = genai_spans.operation_of(request)
        # Not made current: the stream is read across tasks (the HTTP front's first read and the rest),
        # so a context attached in one read could not be detached in another. It is the explicit parent.
        span = self.tracer.start_span(
            genai_spans.span_name(operation, request.model),
            attributes=genai_spans.request_attributes(operation, request.model, workload, request.sampling),
        )
        outcome = genai_spans.GenerateOutcome()
        try:
            async for response in self._generate(request, workload, deadline, started, tally, span):
                if outcome.observe(response):
                    span.add_event("first_token", {"hanzo.node_id": response.node_id})
                yield response
        except BaseException as exc:
            genai_spans.record_failure(span, exc)
            raise
        finally:
            span.set_attributes(outcome.attributes(request.request_id, request.model))
            span.end()

    async def _generate(
        self,
        request: inference_pb2.GenerateRequest,
        workload: WorkloadClass,
        deadline: Deadline,
        started: float,
        tally: Tally,
        span: trace.Span,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """generate's stream, its picks and worker calls traced as children of span."""
        hints = hints_of(validate_generate(request))
        request.workload_class = int(workload)
        request.request_id = request.request_id or f"{self._id_prefix}-{next(self._ids):x}"
        excluded: list[str] = []
        last_error: grpc.aio.AioRpcError | None = None
        for attempt in range(self.settings.max_attempts):
            with parent_span(span):
                pick = await self._pick(request.model, workload, excluded, deadline, last_error, hints)
            if pick is None:
                break
            sent_any = False
            tokens_sent = 0
            with client_call_span(self.tracer, _WORKER_GENERATE, parent=span) as (call_span, metadata):
                call = self.upstream.link(pick.address).start(request, _timeout(deadline), dict(metadata))
                try:
                    async for response in call:
                        if not sent_any:
                            response.node_id = response.node_id or pick.node_id
                            response.workload_class = int(workload)
                            tally.ttft[workload].observe(time.monotonic() - started)
                        sent_any = True
                        tokens_sent += len(response.token_ids)
                        if response.finish_reason:  # a choice's last message: its usage
                            usage = response.usage  # the prompt once per request, not per choice
                            prompt_tokens = usage.prompt_tokens if response.index == 0 else 0
                            self.tenant_tokens.add(request.tenant, prompt_tokens, usage.completion_tokens)
                        yield response
                except grpc.aio.AioRpcError as failed:
                    record_rpc_error(call_span, failed.code(), failed.details())
                    error = failed
                else:
                    error = None
                finally:
                    call.cancel()  # a cancelled caller cancels the worker's stream, which frees its KV
            if error is None:
                tally.ok[workload].inc()
                return
            if isinstance(error, LinkBroken):
                self.upstream.ejections.eject(pick.node_id, error.details() or "its link broke")
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                # The caller's own deadline, passed on: the worker's timer may fire before ours does.
                tally.failed(workload, grpc.StatusCode.DEADLINE_EXCEEDED)
                raise DeadlineExceeded(
                    f"the caller's deadline passed after worker {pick.node_id} sent {tokens_sent} tokens"
                ) from None
            if sent_any:
                tally.failed(workload, grpc.StatusCode.UNAVAILABLE)
                raise Unavailable(
                    f"worker {pick.node_id} failed after {tokens_sent} tokens were sent "
                    f"({error.code().name}: {error.details()}); the stream ends here, nothing is repeated"
                ) from None
            if error.code() not in _RETRYABLE:
                tally.failed(workload, error.code())
                raise relay(error, f"worker {pick.node_id}") from None
            last_error = error
            excluded.append(pick.node_id)
            tally.retries[workload].inc()
            span.add_event("retry", {"hanzo.failed_node": pick.node_id, "hanzo.attempt": attempt + 1})
        tally.failed(workload, _final_code(last_error))
        raise _exhausted(last_error, self.settings.max_attempts, "served the request")

    async def embed(
        self, request: inference_pb2.EmbedRequest, deadline: Deadline, tally: Tally
    ) -> inference_pb2.EmbedResponse:
        """The vectors of request.inputs from one worker, moved to another while one fails retryably;
        recorded as a GenAI span (`embeddings minilm`)."""
        if not self.recording:
            return await self._embed(request, deadline, tally)
        operation = genai_spans.EMBEDDINGS
        with self.tracer.start_as_current_span(
            genai_spans.span_name(operation, request.model),
            attributes=genai_spans.request_attributes(operation, request.model, WorkloadClass.EMBEDDING),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                reply = await self._embed(request, deadline, tally)
            except BaseException as exc:
                genai_spans.record_failure(span, exc)
                raise
            span.set_attributes(
                {
                    "gen_ai.response.model": request.model,
                    "gen_ai.usage.input_tokens": reply.usage.prompt_tokens,
                }
            )
            return reply

    async def _embed(
        self, request: inference_pb2.EmbedRequest, deadline: Deadline, tally: Tally
    ) -> inference_pb2.EmbedResponse:
        validate_embed(request)
        excluded: list[str] = []
        last_error: grpc.aio.AioRpcError | None = None
        for _ in range(self.settings.max_attempts):
            pick = await self._pick(request.model, WorkloadClass.EMBEDDING, excluded, deadline, last_error)
            if pick is None:
                break
            try:
                with client_call_span(self.tracer, _WORKER_EMBED, self.upstream.internal) as (span, metadata):
                    try:
                        reply = await self.upstream.worker(pick.address).Embed(
                            request, timeout=_timeout(deadline), metadata=metadata
                        )
                    except grpc.aio.AioRpcError as failed:
                        record_rpc_error(span, failed.code(), failed.details())
                        raise
            except grpc.aio.AioRpcError as error:
                if error.code() not in _RETRYABLE:
                    raise relay(error, f"worker {pick.node_id}") from None
                last_error = error
                excluded.append(pick.node_id)
                continue
            tally.ok[WorkloadClass.EMBEDDING].inc()
            return reply
        raise _exhausted(last_error, self.settings.max_attempts, "embedded the inputs")

    async def list_models(self, deadline: Deadline) -> inference_pb2.ListModelsResponse:
        """Every model some serving (not draining) worker reports, with its count of resident replicas."""
        nodes = await self.upstream.list_nodes(_timeout(deadline, self.settings.pick_timeout_s))
        cards: dict[str, inference_pb2.ModelCard] = {}
        for node in nodes.nodes:
            if node.draining:
                continue
            for model in node.models:
                card = cards.setdefault(model.name, inference_pb2.ModelCard(name=model.name, kind=model.kind))
                card.replicas += int(model.resident)
        return inference_pb2.ListModelsResponse(models=[cards[name] for name in sorted(cards)])

    async def _pick(
        self,
        model: str,
        workload: WorkloadClass,
        excluded: list[str],
        deadline: Deadline,
        last_error: grpc.aio.AioRpcError | None,
        hints: PromptHints = NO_HINTS,
    ) -> Placement | None:
        """The next worker to try; None once every worker was tried (the caller reports why they failed)."""
        timeout = _timeout(deadline, self.settings.pick_timeout_s)
        try:
            return await self.upstream.pick(model, workload, excluded, timeout, hints)
        except Unavailable:
            if last_error is None:
                raise
            return None


def _timeout(deadline: Deadline, cap_s: float | None = None) -> float | None:
    """What is left of the caller's deadline (propagated to every hop), capped at cap_s."""
    remaining = deadline.time_remaining()
    if remaining is not None and remaining <= 0:
        raise DeadlineExceeded("the caller's deadline passed before the request could be placed")
    if cap_s is None:
        return remaining
    return cap_s if remaining is None else min(remaining, cap_s)


def _final_code(last_error: grpc.aio.AioRpcError | None) -> grpc.StatusCode:
    """Every worker overloaded -> RESOURCE_EXHAUSTED (the caller should back off); else UNAVAILABLE."""
    if last_error is not None and last_error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.UNAVAILABLE


def _exhausted(last_error: grpc.aio.AioRpcError | None, attempts: int, what: str) -> ServiceError:
    detail = last_error.details() if last_error else "no attempt made"
    if last_error is not None and _final_code(last_error) == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # Pass on the worker's own delay (it knows its queue and token rate) rather than guessing one.
        hinted = retry_after_of(last_error)
        return ResourceExhausted(
            f"every worker tried is overloaded ({detail})",
            retry_after_s=hinted if hinted is not None else _DEFAULT_RETRY_S,
        )
    return Unavailable(f"no worker {what} after {attempts} attempts: {detail}")
