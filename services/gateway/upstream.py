"""The gateway's clients: the placer (one channel) and the workers (a channel per address, kept)."""

from __future__ import annotations

import time
from typing import NamedTuple

import grpc
from opentelemetry.trace import TracerProvider

from hanzo.inference.v1 import common_pb2, placer_pb2, placer_pb2_grpc, worker_pb2_grpc
from services.common.channels import internal_channel
from services.common.errors import NotFound, ResourceExhausted, ServiceError, Unavailable
from services.common.internal_auth import call_metadata
from services.common.retry_info import retry_after_of
from services.common.tracing import client_call_span, local_span, record_rpc_error
from services.common.workload import WorkloadClass
from services.gateway.ejections import Ejections
from services.gateway.placer_link import PlacerLink
from services.gateway.prefix_chain import NO_HINTS, PromptHints
from services.gateway.worker_link import WorkerLink
from services.placer.pick.query import PickQuery
from services.placer.replica import PlacerReplica

_PLACER_PICK = "/hanzo.inference.v1.Placer/Pick"  # a pick over the link reads as a Pick call
_PLACER_LIST_NODES = "/hanzo.inference.v1.Placer/ListNodes"


class Placement(NamedTuple):
    """The worker chosen for one attempt."""

    node_id: str
    address: str


def relay(error: grpc.aio.AioRpcError, what: str) -> ServiceError:
    """An upstream failure as our own error with the same status code (and retry delay, if overloaded)."""
    message = f"{what}: {error.details()}"
    if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ResourceExhausted(message, retry_after_of(error))
    relayed = ServiceError(message)
    relayed.code = error.code()
    return relayed


class _Worker(NamedTuple):
    channel: grpc.aio.Channel
    stub: worker_pb2_grpc.WorkerStub
    link: WorkerLink


class Upstream:
    """local: an embedded placer replica to pick with in-process; None asks the placer service."""

    def __init__(
        self,
        placer_address: str,
        tracer_provider: TracerProvider,
        topology: common_pb2.Topology,
        local: PlacerReplica | None = None,
        internal_token: str | None = None,
        worker_keepalive_s: float | None = None,
        ejections: Ejections | None = None,
    ) -> None:
        """worker_keepalive_s: how often worker connections are pinged (and how long an unanswered ping
        may wait) before their calls fail; ejections: workers left out of picks (ejections.py)."""
        self.local = local
        self.worker_keepalive_s = worker_keepalive_s
        self.ejections = ejections or Ejections(0.0)
        self.internal = call_metadata(internal_token)  # on every call to a worker or the placer
        self._tracer = tracer_provider.get_tracer("hanzo.gateway")
        # No client interceptors: they would trace the long-lived PickStream call as one span; each pick
        # and ListNodes call gets its own CLIENT span instead (client_call_span).
        self._placer_channel = internal_channel(placer_address, keepalive_s=worker_keepalive_s)
        self.placer = placer_pb2_grpc.PlacerStub(self._placer_channel)
        self.placer_link = PlacerLink(self.placer, self.internal)  # every remote pick goes over it
        self.topology = topology
        self._workers: dict[str, _Worker] = {}

    def worker(self, address: str) -> worker_pb2_grpc.WorkerStub:
        """A stub for the worker at address, reusing its channel."""
        return self._worker(address).stub

    def link(self, address: str) -> WorkerLink:
        """The Generate stream link to the worker at address (one call carries every stream)."""
        return self._worker(address).link

    def _worker(self, address: str) -> _Worker:
        worker = self._workers.get(address)
        if worker is None:
            # No client interceptors: the servicer opens each call's span itself (client_call_span),
            # keeping grpc.aio's interceptor machinery off the streaming hot path.
            # Reconnects at most a second apart: gRPC's backoff, grown while a worker was down or hung,
            # would keep failing calls to it for up to two minutes after it is back.
            channel = internal_channel(address, keepalive_s=self.worker_keepalive_s, reconnect_backoff_s=1.0)
            stub = worker_pb2_grpc.WorkerStub(channel)
            link = WorkerLink(stub, address, self.internal)
            worker = self._workers[address] = _Worker(channel, stub, link)
        return worker

    async def pick(
        self,
        model: str,
        workload: WorkloadClass,
        exclude: list[str],
        timeout_s: float,
        hints: PromptHints = NO_HINTS,
    ) -> Placement:
        """The worker the placer chooses, leaving out exclude and the ejected workers (unless that leaves
        none); NotFound for an unknown model, Unavailable when none can serve."""
        ejected = [node for node in self.ejections.active() if node not in exclude]
        if ejected:
            try:
                return await self._pick(model, workload, [*exclude, *ejected], timeout_s, hints)
            except Unavailable:
                pass  # every other worker is gone too: a suspect one beats none (Envoy's panic mode)
        return await self._pick(model, workload, exclude, timeout_s, hints)

    async def _pick(
        self,
        model: str,
        workload: WorkloadClass,
        exclude: list[str],
        timeout_s: float,
        hints: PromptHints,
    ) -> Placement:
        if self.local is not None:
            query = PickQuery(
                model=model,
                workload_class=workload,
                caller_zone=self.topology.zone,
                caller_rack=self.topology.rack,
                caller_host=self.topology.host,
                prefix_chain=hints.chain,
                prefix_chain_tokens=hints.chain_tokens,
                prompt_tokens=hints.prompt_tokens,
                exclude=frozenset(exclude),
                now_s=time.time(),
                explain_top=0,  # nobody reads the runners-up here
            )
            with local_span(self._tracer, "pick", {"hanzo.placement": "embedded"}):
                chosen = self.local.choose(query)  # raises NotFound / Unavailable itself
            return Placement(chosen.node_id, chosen.address)
        request = placer_pb2.PickRequest(
            model=model,
            workload_class=int(workload),
            caller=self.topology,
            exclude_nodes=exclude,
            prefix_chain=hints.chain,
            prefix_chain_tokens=hints.chain_tokens,
            prompt_tokens=hints.prompt_tokens,
            node_only=True,  # nobody reads the runners-up here
        )
        with client_call_span(self._tracer, _PLACER_PICK) as (span, metadata):
            try:
                reply = await self.placer_link.pick(request, timeout_s, dict(metadata))
            except grpc.aio.AioRpcError as failed:
                record_rpc_error(span, failed.code(), failed.details())
                error = failed
            else:
                return Placement(reply.node_id, reply.address)
        if error.code() == grpc.StatusCode.NOT_FOUND:
            raise NotFound(error.details())
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise relay(error, "placer rejected the request")
        raise Unavailable(f"no worker available for {model!r}: {error.details()}")

    async def list_nodes(self, timeout_s: float) -> placer_pb2.ListNodesReply:
        if self.local is not None:
            return self.local.list_nodes([])
        with client_call_span(self._tracer, _PLACER_LIST_NODES, self.internal) as (span, metadata):
            try:
                return await self.placer.ListNodes(
                    placer_pb2.ListNodesRequest(), timeout=timeout_s, metadata=metadata
                )
            except grpc.aio.AioRpcError as error:
                record_rpc_error(span, error.code(), error.details())
                raise Unavailable(f"placer unreachable: {error.details()}") from None

    async def close(self) -> None:
        for worker in self._workers.values():
            await worker.link.close()
            await worker.channel.close()
        await self.placer_link.close()
        await self._placer_channel.close()
