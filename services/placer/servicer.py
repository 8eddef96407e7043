"""The Placer gRPC service: thin handlers from protobuf to the cluster view and the picker and back."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc

from hanzo.inference.v1 import cluster_state_pb2, placer_pb2, placer_pb2_grpc, telemetry_pb2
from services.common.errors import InvalidArgument, NotFound, Unavailable
from services.common.workload import WorkloadClass
from services.placer.cluster.store import ClusterStore
from services.placer.cluster.view import ClusterView
from services.placer.config import PlacerSettings
from services.placer.demand import DemandCounter
from services.placer.metrics import PlacerMetrics
from services.placer.pick.framework import Picker
from services.placer.pick.query import PickQuery
from services.placer.placement import directives


class PlacerServicer(placer_pb2_grpc.PlacerServicer):
    def __init__(
        self,
        settings: PlacerSettings,
        store: ClusterStore,
        view: ClusterView,
        picker: Picker,
        demand: DemandCounter,
        metrics: PlacerMetrics,
    ) -> None:
        self.settings = settings
        self.store = store
        self.view = view
        self.picker = picker
        self.demand = demand
        self.metrics = metrics

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
                self._observe_sample(report.node_id, sample)
                try:
                    await self.store.write_thermal(report.node_id, entry, self.settings.node_ttl_s)
                except Exception as exc:
                    self.view.mark_stale(exc)
                accepted += 1
        return telemetry_pb2.TelemetryAck(samples_accepted=accepted)

    async def Pick(
        self, request: placer_pb2.PickRequest, context: grpc.aio.ServicerContext
    ) -> placer_pb2.PickReply:
        return self.pick(request)

    def pick(self, request: placer_pb2.PickRequest) -> placer_pb2.PickReply:
        """One decision from the current snapshot; synchronous so the snapshot cannot change under it."""
        if not request.model:
            raise InvalidArgument("model", "is empty; name the model to serve")
        try:
            workload = WorkloadClass(request.workload_class)
        except ValueError:
            raise InvalidArgument("workload_class", f"unknown value {request.workload_class}") from None
        view = self.view
        view.expire()
        if not view.synced_once and not view.nodes:
            raise Unavailable("cluster state unknown: Redis has not been read yet; retry shortly")
        query = PickQuery(
            model=request.model,
            workload_class=workload,
            caller_zone=request.caller.zone,
            caller_rack=request.caller.rack,
            caller_host=request.caller.host,
            prefix_hash=request.prefix_hash or None,
            prompt_tokens=request.prompt_tokens,
            exclude=frozenset(request.exclude_nodes),
            now_s=time.time(),
            explain_top=request.explain_top or 3,
        )
        start = time.perf_counter()
        result = self.picker.pick(view.snapshot, query)
        self.metrics.pick_seconds.observe(time.perf_counter() - start)
        self.demand.record(request.model)
        if result is None:
            self.metrics.picks.labels(workload.name, "none").inc()
            if view.snapshot.model_columns(request.model) is None:
                raise NotFound(f"model {request.model!r} is not served by any worker in the cluster")
            raise Unavailable(f"no healthy worker can take model {request.model!r} now; retry shortly")
        self.metrics.picks.labels(workload.name, "picked").inc()
        return placer_pb2.PickReply(
            node_id=result.node_id,
            address=result.address,
            workload_class=int(workload),
            stale=view.stale,
            considered=result.considered,
            candidates=[
                placer_pb2.ScoredCandidate(node_id=c.node_id, total=c.total, scores=c.scores)
                for c in result.candidates
            ],
        )

    async def ListNodes(
        self, request: placer_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> placer_pb2.ListNodesReply:
        self.view.expire()
        nodes = self.view.nodes
        wanted = request.node_ids or sorted(nodes)
        return placer_pb2.ListNodesReply(
            nodes=[nodes[n].report for n in wanted if n in nodes], stale=self.view.stale
        )

    def _observe_sample(self, node_id: str, sample: telemetry_pb2.GpuSample) -> None:
        self.metrics.telemetry_samples.inc()
        self.metrics.gpu_temperature.labels(node_id).set(sample.temperature_c)
        self.metrics.gpu_throttled.labels(node_id).set(sample.clock_event_reasons)
