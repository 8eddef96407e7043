"""The Worker gRPC service: thin handlers between protobuf and the model host."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import grpc
from opentelemetry import trace

from hanzo.inference.v1 import inference_pb2, placer_pb2, worker_pb2, worker_pb2_grpc
from services.common import genai_spans
from services.common.chat import template_inputs, tool_choice_params
from services.common.sampling_proto import sampling_params
from services.common.served import Authenticate, check_caller
from services.common.tracing import record_span
from services.common.workload import WorkloadClass
from services.worker.engine.choices import generate_choices
from services.worker.engine.errors import AdmissionError
from services.worker.engine.outputs import RequestOutput
from services.worker.engine.policy.classes import SchedulingHints
from services.worker.server.chat import ToolReplies, chat_prompt
from services.worker.server.convert import FINISH_REASONS, logprobs_message, prompt_of, token_texts
from services.worker.server.host import ModelHost
from services.worker.server.metrics import WorkerMetrics
from services.worker.server.streams import StreamSession


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(
        self,
        node_id: str,
        host: ModelHost,
        metrics: WorkerMetrics,
        tracer: trace.Tracer,
        authenticate: Authenticate | None = None,
    ) -> None:
        """authenticate: the internal-token check; GenerateStreams applies it itself (serve_instrumented
        leaves that multiplexing method unwrapped)."""
        self.authenticate = authenticate
        self.node_id = node_id
        self.host = host
        self.metrics = metrics
        self.tracer = tracer
        self.draining = False
        self.sessions: set[StreamSession] = set()  # the open GenerateStreams calls

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        async for response in self.generate(request, _deadline(context)):
            yield response

    async def GenerateStreams(
        self, requests: AsyncIterator[worker_pb2.StreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.StreamEvents]:
        await check_caller(self.authenticate, context)
        session = StreamSession(self.generate, self.node_id, lambda: self.draining, self.tracer)
        self.sessions.add(session)
        try:
            async for events in session.run(requests):
                yield events
        finally:
            self.sessions.discard(session)  # the call has ended

    def drain(self) -> None:
        """Refuse new streams (UNAVAILABLE, so the gateway retries elsewhere) and let every stream link
        end once its streams have: a graceful stop must not wait on a link that never ends by itself."""
        self.draining = True
        for session in list(self.sessions):
            session.wake()

    async def generate(
        self, request: inference_pb2.GenerateRequest, deadline: float | None
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """One request's responses, as Generate streams them; deadline: a time.monotonic() instant the
        scheduler orders by (None: the caller set none). Raises typed errors (see error_status.py)."""
        await self.host.reload_if_evicted(request.model)
        llm = self.host.generator(request.model)
        params = sampling_params(request.sampling)
        tools = ToolReplies(None)
        if request.WhichOneof("input") == "chat":
            messages, declared = template_inputs(request.chat)  # InvalidArgument naming the field
            params, mode = tool_choice_params(request.chat.tool_choice, declared, params)
            tools = ToolReplies(mode)
            prompt = chat_prompt(messages, declared, llm.engine.tokenizer, llm.engine.layout.max_model_len)
        else:
            prompt = prompt_of(request)
        workload = _workload(request.workload_class)
        labels = (request.model, workload.name)
        hints = SchedulingHints(workload=workload, tenant=request.tenant, deadline=deadline)
        request_id = request.request_id or uuid.uuid4().hex
        started = time.monotonic()
        first_token_at: dict[int, float] = {}  # per choice
        last_token_at: dict[int, float] = {}
        finished: dict[int, RequestOutput] = {}  # each finished choice's last output
        texts = token_texts(llm.engine.tokenizer) if params.logprobs is not None else None
        try:
            async for index, out in generate_choices(llm, prompt, params, request_id, hints):
                now = time.monotonic()
                response = inference_pb2.GenerateResponse(
                    request_id=request_id, token_ids=out.new_token_ids, text=out.new_text, index=index
                )
                if texts is not None and out.new_logprobs:
                    response.logprobs.extend(logprobs_message(out.new_logprobs, texts))
                if index not in first_token_at:
                    first_token_at[index] = now
                    response.workload_class = int(workload)
                    response.node_id = self.node_id
                    if index == 0:
                        self.metrics.ttft.labels(*labels).observe(now - started)
                elif out.new_token_ids and index in last_token_at:
                    self.metrics.itl.labels(*labels).observe(now - last_token_at[index])
                last_token_at[index] = now
                tools.push(index, out.new_text)
                if out.finished:
                    _finish(response, out)
                    tools.finish(index, response)
                    finished[index] = out
                    self._record(request, workload, started, first_token_at[index], out, finished)
                yield response
        except AdmissionError as exc:  # answered RESOURCE_EXHAUSTED with its delay as RetryInfo
            self.metrics.rejected.labels(*labels, exc.reason).inc()
            raise

    async def Embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        await self.host.reload_if_evicted(request.model)
        with self.host.embedding(request.model) as embedder:
            vectors, num_tokens = await embedder.encode_with_usage(list(request.inputs))
        self.metrics.prompt_tokens.labels(request.model).inc(num_tokens)
        return inference_pb2.EmbedResponse(
            data=[inference_pb2.Embedding(values=row.tolist(), index=i) for i, row in enumerate(vectors)],
            usage=inference_pb2.Usage(prompt_tokens=num_tokens),
            node_id=self.node_id,
        )

    async def LoadModel(
        self, request: worker_pb2.LoadModelRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.LoadModelResponse:
        served, took = await self.host.load(request.model)
        state = placer_pb2.ModelState(
            name=served.name, weight_bytes=served.weight_bytes, resident=True, kind=served.kind
        )
        return worker_pb2.LoadModelResponse(model=state, load_seconds=took)

    async def EvictModel(
        self, request: worker_pb2.EvictModelRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.EvictModelResponse:
        aborted = await self.host.evict(request.model, request.force)
        return worker_pb2.EvictModelResponse(aborted_requests=aborted)

    async def GetStats(
        self, request: worker_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerStats:
        return self.stats()

    def stats(self) -> worker_pb2.WorkerStats:
        """Per-model load and cache counters, also used for metrics and heartbeats."""
        models = []
        for served in self.host.models.values():
            stats = worker_pb2.ModelStats(name=served.name, kind=served.kind)
            if served.llm is not None:
                snap = served.snapshot
                stats.running = snap.running
                stats.waiting = snap.waiting
                stats.kv_usage = snap.kv_usage
                stats.kv_blocks_total = snap.kv_blocks_total
                stats.kv_blocks_used = snap.kv_blocks_used
                stats.prefix_hit_tokens = snap.prefix_hit_tokens
                stats.generated_tokens = snap.generated_tokens
                stats.preemptions = snap.preemptions
            models.append(stats)
        return worker_pb2.WorkerStats(node_id=self.node_id, models=models, draining=self.draining)

    def _record(
        self,
        request: inference_pb2.GenerateRequest,
        workload: WorkloadClass,
        started: float,
        first_token_at: float,
        final: RequestOutput,
        finished: dict[int, RequestOutput],
    ) -> None:
        """Metrics and the engine-phase spans of a finished choice (phases timed in the engine thread);
        finished: the last output of each choice finished so far (final's among them)."""
        end = time.monotonic()
        model = request.model
        labels = (model, workload.name)
        metrics = self.metrics
        metrics.e2e.labels(*labels).observe(end - started)
        metrics.requests.labels(*labels, final.finish_reason or "abort").inc()
        metrics.prompt_tokens.labels(model).inc(final.num_prompt_tokens)
        metrics.generation_tokens.labels(model).inc(final.num_output_tokens)
        metrics.prefix_queries.labels(model).inc(final.num_prompt_tokens)
        metrics.prefix_hits.labels(model).inc(final.num_cached_tokens)
        metrics.request_prompt_tokens.labels(*labels).observe(final.num_prompt_tokens)
        metrics.request_generation_tokens.labels(*labels).observe(final.num_output_tokens)
        scheduled = final.first_scheduled_time or first_token_at
        metrics.queue.labels(*labels).observe(max(0.0, scheduled - started))
        metrics.prefill_time.labels(*labels).observe(max(0.0, first_token_at - scheduled))
        metrics.decode_time.labels(*labels).observe(max(0.0, end - first_token_at))
        metrics.inference_time.labels(*labels).observe(max(0.0, end - scheduled))
        span = trace.get_current_span()
        if not span.is_recording():
            return
        operation = genai_spans.operation_of(request)
        span.set_attributes(genai_spans.request_attributes(operation, model, workload, request.sampling))
        reasons = [finished[i].finish_reason or "abort" for i in sorted(finished)]
        outputs = sum(out.num_output_tokens for out in finished.values())
        response_id = request.request_id or final.request_id
        span.set_attributes(
            genai_spans.response_attributes(response_id, model, reasons, final.num_prompt_tokens, outputs)
        )
        span.set_attributes(
            {"hanzo.node_id": self.node_id, "hanzo.cached_prompt_tokens": final.num_cached_tokens}
        )
        # The scheduler's decision on the phase spans: the class it ordered the request by, the token
        # budget of the step that let it in, whether that step ran nested between another's layers, and
        # how often the request was preempted (its KV dropped and recomputed).
        phase = {"gen_ai.request.model": model, "hanzo.workload_class": workload.name}
        decision = {
            **phase,
            "hanzo.scheduler.budget_tokens": final.first_budget or 0,
            "hanzo.scheduler.nested": final.first_nested,
            "hanzo.scheduler.preemptions": final.num_preemptions,
        }
        prefill = {**phase, "gen_ai.usage.input_tokens": final.num_prompt_tokens,
                   "hanzo.cached_prompt_tokens": final.num_cached_tokens}  # fmt: skip
        decode = {**phase, "gen_ai.usage.output_tokens": final.num_output_tokens,
                  "hanzo.scheduler.preemptions": final.num_preemptions}  # fmt: skip
        record_span(self.tracer, "queue", started, max(started, scheduled), decision)
        record_span(self.tracer, "prefill", max(started, scheduled), first_token_at, prefill)
        record_span(self.tracer, "decode", first_token_at, end, decode)


def _finish(response: inference_pb2.GenerateResponse, out: RequestOutput) -> None:
    """A choice's last response: finish reason, usage and what stopped it."""
    response.finish_reason = FINISH_REASONS[out.finish_reason or "abort"]
    response.usage.CopyFrom(_usage(out))
    if isinstance(out.stop_reason, str):
        response.stop_string = out.stop_reason
    elif out.stop_reason is not None:
        response.stop_token_id = out.stop_reason


def _usage(out: RequestOutput) -> inference_pb2.Usage:
    return inference_pb2.Usage(
        prompt_tokens=out.num_prompt_tokens,
        completion_tokens=out.num_output_tokens,
        cached_prompt_tokens=out.num_cached_tokens,
    )


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The caller's gRPC deadline as a time.monotonic() instant; None when the caller set none."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def _workload(value: int) -> WorkloadClass:
    try:
        return WorkloadClass(value)
    except ValueError:
        return WorkloadClass.UNSPECIFIED
