"""The public Inference service: authenticate (interceptor), validate, classify, pick, forward, stream.

A request moves to another worker only while nothing has been sent to the caller; after the first
token a failure ends the stream with UNAVAILABLE saying how many tokens were delivered, so no token is
ever duplicated.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import grpc
from opentelemetry import trace

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc, worker_pb2
from services.common.errors import (
    InvalidArgument,
    ResourceExhausted,
    ServiceError,
    Unavailable,
    split_retry_hint,
)
from services.common.tracing import client_call_span, local_span, record_rpc_error, records_spans
from services.common.workload import WorkloadClass
from services.gateway.classify import classify_generate
from services.gateway.config import GatewaySettings
from services.gateway.metrics import GatewayMetrics
from services.gateway.upstream import Placement, Upstream, relay
from services.worker.server.convert import sampling_params

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


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self, settings: GatewaySettings, upstream: Upstream, metrics: GatewayMetrics, tracer: trace.Tracer
    ):
        self.settings = settings
        self.upstream = upstream
        self.metrics = metrics
        self.tracer = tracer
        self.recording = records_spans(tracer)
        # Ids for requests that came without one: unique per gateway process (random prefix) and per
        # request (counter), without a random draw each time.
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count()

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        started = time.monotonic()  # TTFT as the caller sees it: validation and classification included
        with local_span(self.tracer, "classify") as span:
            workload = classify_generate(request, context.invocation_metadata())
            span.set_attribute("hanzo.workload_class", workload.name)
        prompt = _validate_generate(request)
        # Forwarded as it came, with the class and id filled in: the message is this call's own.
        request.workload_class = int(workload)
        request.request_id = request.request_id or f"{self._id_prefix}-{next(self._ids):x}"
        if self.recording:
            trace.get_current_span().set_attributes(
                {"gen_ai.request.model": request.model, "hanzo.workload_class": workload.name,
                 "hanzo.request_id": request.request_id}
            )  # fmt: skip
        excluded: list[str] = []
        last_error: grpc.aio.AioRpcError | None = None
        for attempt in range(self.settings.max_attempts):
            pick = await self._pick(request.model, workload, excluded, context, last_error, prompt)
            if pick is None:
                break
            sent_any = False
            tokens_sent = 0
            with client_call_span(self.tracer, _WORKER_GENERATE) as (span, metadata):
                call = self.upstream.link(pick.address).start(request, self._timeout(context), dict(metadata))
                try:
                    async for response in call:
                        if not sent_any:
                            response.node_id = response.node_id or pick.node_id
                            response.workload_class = int(workload)
                            self.metrics.ttft[workload].observe(time.monotonic() - started)
                        sent_any = True
                        tokens_sent += len(response.token_ids)
                        yield response
                except grpc.aio.AioRpcError as failed:
                    record_rpc_error(span, failed.code(), failed.details())
                    error = failed
                else:
                    error = None
                finally:
                    call.cancel()  # a cancelled caller cancels the worker's stream, which frees its KV
            if error is None:
                self.metrics.generated[workload].inc()
                return
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                # The caller's own deadline, passed on: the worker's timer may fire before ours does.
                self.metrics.requests.labels("Generate", workload.name, "DEADLINE_EXCEEDED").inc()
                raise _DeadlineExceeded(
                    f"the caller's deadline passed after worker {pick.node_id} sent {tokens_sent} tokens"
                ) from None
            if sent_any:
                self.metrics.requests.labels("Generate", workload.name, "UNAVAILABLE").inc()
                raise Unavailable(
                    f"worker {pick.node_id} failed after {tokens_sent} tokens were sent "
                    f"({error.code().name}: {error.details()}); the stream ends here, nothing is repeated"
                ) from None
            if error.code() not in _RETRYABLE:
                self.metrics.requests.labels("Generate", workload.name, error.code().name).inc()
                raise relay(error, f"worker {pick.node_id}") from None
            last_error = error
            excluded.append(pick.node_id)
            self.metrics.retries.labels(workload.name).inc()
            trace.get_current_span().add_event(
                "retry", {"hanzo.failed_node": pick.node_id, "hanzo.attempt": attempt + 1}
            )
        self.metrics.requests.labels("Generate", workload.name, _final_code(last_error).name).inc()
        raise _exhausted(last_error, self.settings.max_attempts, "served the request")

    async def Embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        _validate_embed(request)
        excluded: list[str] = []
        last_error: grpc.aio.AioRpcError | None = None
        for _ in range(self.settings.max_attempts):
            pick = await self._pick(request.model, WorkloadClass.EMBEDDING, excluded, context, last_error)
            if pick is None:
                break
            try:
                with client_call_span(self.tracer, _WORKER_EMBED) as (span, metadata):
                    try:
                        reply = await self.upstream.worker(pick.address).Embed(
                            request, timeout=self._timeout(context), metadata=metadata
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
            self.metrics.requests.labels("Embed", WorkloadClass.EMBEDDING.name, "OK").inc()
            return reply
        raise _exhausted(last_error, self.settings.max_attempts, "embedded the inputs")

    async def ListModels(
        self, request: inference_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ListModelsResponse:
        nodes = await self.upstream.list_nodes(self._timeout(context, self.settings.pick_timeout_s))
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
        context: grpc.aio.ServicerContext,
        last_error: grpc.aio.AioRpcError | None,
        prompt: str | Sequence[int] | None = None,
    ) -> Placement | None:
        """The next worker to try; None once every worker was tried (the caller reports why they failed)."""
        timeout = self._timeout(context, self.settings.pick_timeout_s)
        try:
            return await self.upstream.pick(model, workload, excluded, timeout, prompt)
        except Unavailable:
            if last_error is None:
                raise
            return None

    @staticmethod
    def _timeout(context: grpc.aio.ServicerContext, cap_s: float | None = None) -> float | None:
        """What is left of the caller's deadline (propagated to every hop), capped at cap_s."""
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise _DeadlineExceeded("the caller's deadline passed before the request could be placed")
        if cap_s is None:
            return remaining
        return cap_s if remaining is None else min(remaining, cap_s)


_DEFAULT_RETRY_S = 1.0  # when an overloaded worker gave no hint of its own


def _final_code(last_error: grpc.aio.AioRpcError | None) -> grpc.StatusCode:
    """Every worker overloaded -> RESOURCE_EXHAUSTED (the caller should back off); else UNAVAILABLE."""
    if last_error is not None and last_error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.UNAVAILABLE


def _exhausted(last_error: grpc.aio.AioRpcError | None, attempts: int, what: str) -> ServiceError:
    detail = last_error.details() if last_error else "no attempt made"
    if _final_code(last_error) == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # Pass on the worker's own hint (it knows its queue and token rate) rather than adding a second.
        detail, hinted = split_retry_hint(detail or "")
        return ResourceExhausted(
            f"every worker tried is overloaded ({detail})",
            retry_after_s=hinted if hinted is not None else _DEFAULT_RETRY_S,
        )
    return Unavailable(f"no worker {what} after {attempts} attempts: {detail}")


class _DeadlineExceeded(Unavailable):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


def _validate_generate(request: inference_pb2.GenerateRequest) -> str | Sequence[int]:
    """The prompt; InvalidArgument naming the field for anything the worker would refuse anyway."""
    if not request.model:
        raise InvalidArgument("model", "is empty; name a model (ListModels shows them)")
    which = request.WhichOneof("input")
    if which is None:
        raise InvalidArgument("prompt", "missing: set prompt (text) or prompt_token_ids")
    # The token ids stay in the message: copying a long prompt into a list costs more than all the rest.
    prompt = request.prompt if which == "prompt" else request.prompt_token_ids.ids
    if not prompt:
        raise InvalidArgument("prompt", "is empty; send text or at least one token id")
    sampling_params(request.sampling)  # raises InvalidRequestError (-> INVALID_ARGUMENT) naming the field
    return prompt


def _validate_embed(request: inference_pb2.EmbedRequest) -> None:
    if not request.model:
        raise InvalidArgument("model", "is empty; name an embedding model (ListModels shows them)")
    if not request.inputs:
        raise InvalidArgument("inputs", "is empty; send at least one text")
    for i, text in enumerate(request.inputs):
        if not text.strip():
            raise InvalidArgument(f"inputs[{i}]", "is empty")
