"""The Placer gRPC service: thin handlers from protobuf to the cluster view and the picker and back
(PickStream's picks: pick_stream.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
from opentelemetry import trace

from hanzo.inference.v1 import cluster_state_pb2, placer_pb2, placer_pb2_grpc, telemetry_pb2
from services.common.errors import InvalidArgument
from services.common.served import Authenticate, check_caller
from services.placer.config import PlacerSettings
from services.placer.pick_stream import PickAnswerer
from services.placer.placement import directives
from services.placer.replica import PlacerReplica


class PlacerServicer(placer_pb2_grpc.PlacerServicer):
    def __init__(
        self,
        settings: PlacerSettings,
        replica: PlacerReplica,
        tracer: trace.Tracer | None = None,
        authenticate: Authenticate | None = None,
    ) -> None:
        """authenticate: the internal-token check; PickStream applies it itself (serve_instrumented leaves
        that multiplexing method unwrapped, its picks traced one by one)."""
        self.settings = settings
        self.replica = replica
        self.store = replica.store
        self.view = replica.view
        self.metrics = replica.metrics
        self.authenticate = authenticate
        self.answerer = PickAnswerer(replica.pick, tracer or trace.NoOpTracer())

    async def Heartbeat(
        self, request: placer_pb2.NodeReport, context: grpc.aio.ServicerContext
    ) -> placer_pb2.HeartbeatReply:
        if not request.node_id:
            raise InvalidArgument("node_id", "is empty; every worker needs a unique id")
        if not request.address:
            raise InvalidArgument("address", f"is empty for node {request.node_id!r}; send its host:port")
        entry = cluster_state_pb2.NodeEntry(report=request, deadline_s=time.time() + self.settings.node_ttl_s)
        self.view.apply_node(entry)  # this placer's own view is fresh even while Redis is down
        self.metrics.heartbeats.inc()
        desired = None
        try:
            await self.store.write_node(entry, self.settings.node_ttl_s)
            desired = await self.store.read_placement(request.node_id)
        except Exception as exc:  # Redis down: the next heartbeat rewrites everything (idempotent)
            self.view.mark_stale(exc)
        resident = {m.name for m in request.models if m.resident}
        load, evict = directives(None if desired is None else set(desired), resident)
        return placer_pb2.HeartbeatReply(
            heartbeat_interval_s=self.settings.heartbeat_interval_s, load_models=load, evict_models=evict
        )

    async def StreamTelemetry(
        self,
        request_iterator: AsyncIterator[telemetry_pb2.TelemetryReport],
        context: grpc.aio.ServicerContext,
    ) -> telemetry_pb2.TelemetryAck:
        accepted = 0
        async for report in request_iterator:
            if not report.node_id:
                raise InvalidArgument("node_id", "is empty in a telemetry report")
            for sample in report.samples:
                entry = self.view.thermal_entry(report.node_id, sample)
                self.view.apply_thermal(report.node_id, entry)
                self.metrics.telemetry_samples.inc()
                try:
                    await self.store.write_thermal(report.node_id, entry, self.settings.node_ttl_s)
                except Exception as exc:
                    self.view.mark_stale(exc)
                accepted += 1
        return telemetry_pb2.TelemetryAck(samples_accepted=accepted)

    async def Pick(
        self, request: placer_pb2.PickRequest, context: grpc.aio.ServicerContext
    ) -> placer_pb2.PickReply:
        return self.replica.pick(request)

    async def PickStream(
        self, requests: AsyncIterator[placer_pb2.PickCalls], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[placer_pb2.PickAnswers]:
        await check_caller(self.authenticate, context)
        async for calls in requests:
            try:
                answers = self.answerer.answer(calls)
            except InvalidArgument as refused:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(refused))
            yield answers

    async def ListNodes(
        self, request: placer_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> placer_pb2.ListNodesReply:
        return self.replica.list_nodes(list(request.node_ids))
