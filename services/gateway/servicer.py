"""The public Inference service over gRPC: classify with the call's metadata, then the shared request
path (router.py) with the call's context as the deadline. Authentication, spans and error statuses are
the served wrapper's (services/common/served.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
from opentelemetry import trace

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc
from services.common.tracing import local_span
from services.common.workload import WorkloadClass
from services.gateway.classify import classify_generate
from services.gateway.metrics import GRPC, GatewayMetrics
from services.gateway.router import Router


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    # Generate and Chat are plain functions returning the router's stream rather than async generators
    # relaying it: one generator frame fewer per streamed message. The served wrapper iterates them.

    def __init__(self, router: Router, metrics: GatewayMetrics, tracer: trace.Tracer) -> None:
        self.router = router
        self.tracer = tracer
        self._generate = metrics.tally("Generate", GRPC)
        self._chat = metrics.tally("Chat", GRPC)
        self._embed = metrics.tally("Embed", GRPC)

    def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        started = time.monotonic()  # TTFT as the caller sees it: validation and classification included
        workload = self._classify(request, context)
        return self.router.generate(request, workload, context, started, self._generate)

    def Chat(
        self, request: inference_pb2.ChatRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """A chat as a Generate request with chat input: the worker renders it with the model's template."""
        started = time.monotonic()
        generate = chat_to_generate(request)
        workload = self._classify(generate, context)
        return self.router.generate(generate, workload, context, started, self._chat)

    async def Embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        return await self.router.embed(request, context, self._embed)

    async def ListModels(
        self, request: inference_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ListModelsResponse:
        return await self.router.list_models(context)

    def _classify(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> WorkloadClass:
        with local_span(self.tracer, "classify") as span:
            workload = classify_generate(request, context.invocation_metadata())
            span.set_attribute("hanzo.workload_class", workload.name)
        return workload


def chat_to_generate(request: inference_pb2.ChatRequest) -> inference_pb2.GenerateRequest:
    """The GenerateRequest that carries a Chat request to a worker, every field kept."""
    return inference_pb2.GenerateRequest(
        model=request.model,
        chat=inference_pb2.ChatInput(
            messages=request.messages, tools=request.tools, tool_choice=request.tool_choice
        ),
        sampling=request.sampling,
        workload_class=request.workload_class,
        request_id=request.request_id,
        tenant=request.tenant,
    )
