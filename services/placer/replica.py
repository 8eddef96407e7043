"""One placer replica's decision-making, without a server: a Redis-fed cluster view, the picker and
local demand counts. The Placer service wraps it; a gateway may embed one to pick in-process (placers
are stateless readers of Redis, so an embedded replica decides exactly as a remote one would)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

from hanzo.inference.v1 import placer_pb2
from services.common.errors import InvalidArgument, NotFound, Unavailable
from services.common.tasks import cancel_and_wait
from services.common.workload import WorkloadClass
from services.placer.cluster.schema import Keys
from services.placer.cluster.store import ClusterStore
from services.placer.cluster.view import ClusterView, SyncSettings
from services.placer.config import PREFIX_CAPACITY
from services.placer.demand import DemandCounter
from services.placer.metrics import PlacerMetrics
from services.placer.pick.framework import Picker, PickResult
from services.placer.pick.prefix_cost import DEFAULT_PREFIX_BALANCE, PrefixBalance, latency_tokens_of
from services.placer.pick.query import MAX_PREFIX_CHAIN, PickQuery
from services.placer.pick.scorers import ScorerConfig, build_scorers
from services.placer.pick.weights import ClassWeights


class PlacerReplica:
    """`await start()` syncs the view and keeps it fresh; `pick()` decides from memory."""

    def __init__(
        self,
        redis_url: str,
        key_prefix: str,
        resync_interval_s: float,
        class_weights: dict[str, dict[str, float]],
        metrics: PlacerMetrics,
        prefix_capacity: int = PREFIX_CAPACITY,
        prefix_balance: PrefixBalance = DEFAULT_PREFIX_BALANCE,
        scorer_config: ScorerConfig | None = None,
    ) -> None:
        """prefix_capacity: prefix chain elements the picker's memo remembers (see PREFIX_CAPACITY);
        prefix_balance: where the prefix cost rule stops following a prefix (prefix_cost.py);
        scorer_config: the scorers' constants (None: the defaults)."""
        self.store = ClusterStore(redis_url, Keys(key_prefix))
        self.view = ClusterView(self.store, SyncSettings(resync_interval_s=resync_interval_s))
        weights = ClassWeights.from_config(class_weights)
        self.picker = Picker(
            weights,
            scorers=build_scorers(scorer_config),
            prefix_capacity=prefix_capacity,
            prefix_balance=prefix_balance,
        )
        self._weights = {w: weights.for_class(w) for w in WorkloadClass}  # what decides the winning scorer
        self.demand = DemandCounter()
        self.metrics = metrics
        metrics.watch(self.view)
        self._flusher: asyncio.Task[None] | None = None

    async def start(self, demand_window_s: float | None = None) -> None:
        """Sync the view; with demand_window_s, also publish local demand to Redis every window (an
        embedded replica has no planner loop of its own to do it)."""
        await self.view.start()
        if demand_window_s is not None:
            self._flusher = asyncio.create_task(self._flush_demand(demand_window_s), name="demand-flush")

    async def stop(self) -> None:
        if self._flusher is not None:
            await cancel_and_wait([self._flusher])
        await self.view.stop()
        await self.store.close()

    def pick(self, request: placer_pb2.PickRequest) -> placer_pb2.PickReply:
        """The Pick RPC's decision, explained (runners-up and their scores) unless the request asks for the
        node only."""
        query = self.query_of(request)
        workload = query.workload_class
        result = self.choose(query)
        reply = placer_pb2.PickReply(
            node_id=result.node_id,
            address=result.address,
            workload_class=int(workload),
            stale=self.view.stale,
            considered=result.considered,
        )
        if not request.node_only:
            reply.candidates.extend(
                placer_pb2.ScoredCandidate(node_id=c.node_id, total=c.total, scores=c.scores)
                for c in result.candidates
            )
        return reply

    @staticmethod
    def query_of(request: placer_pb2.PickRequest) -> PickQuery:
        """The Pick RPC's request as a PickQuery at the current time; InvalidArgument naming the field
        that is wrong."""
        if not request.model:
            raise InvalidArgument("model", "is empty; name the model to serve")
        try:
            workload = WorkloadClass(request.workload_class)
        except ValueError:
            raise InvalidArgument("workload_class", f"unknown value {request.workload_class}") from None
        chain, ends = request.prefix_chain, request.prefix_chain_tokens
        if len(chain) > MAX_PREFIX_CHAIN:
            raise InvalidArgument(
                "prefix_chain", f"has {len(chain)} elements; send at most {MAX_PREFIX_CHAIN}"
            )
        if ends and len(ends) != len(chain):
            raise InvalidArgument(
                "prefix_chain_tokens",
                f"has {len(ends)} entries for {len(chain)} chain elements; send one an element or none",
            )
        if any(later < earlier for earlier, later in itertools.pairwise(ends)):
            raise InvalidArgument(
                "prefix_chain_tokens", "must not decrease: each element ends where its prefix ends"
            )
        return PickQuery(
            model=request.model,
            workload_class=workload,
            caller_zone=request.caller.zone,
            caller_rack=request.caller.rack,
            caller_host=request.caller.host,
            prefix_chain=tuple(chain),
            prefix_chain_tokens=tuple(ends),
            prompt_tokens=request.prompt_tokens,
            exclude=frozenset(request.exclude_nodes),
            now_s=time.time(),
            explain_top=0 if request.node_only else request.explain_top or 3,
        )

    def choose(self, query: PickQuery) -> PickResult:
        """One decision from the current snapshot; synchronous so the snapshot cannot change under it.
        NotFound for a model no worker reported, Unavailable when no healthy worker can take it now. An
        embedded replica calls this directly, with no reply message to build."""
        view = self.view
        view.expire()
        if not view.synced_once and not view.nodes:
            raise Unavailable("cluster state unknown: Redis has not been read yet; retry shortly")
        start = time.perf_counter()
        result = self.picker.pick(view.snapshot, query)
        self.metrics.pick_seconds[query.workload_class].observe(time.perf_counter() - start)
        self.demand.record(query.model)
        if result is None:
            self.metrics.picks.labels(query.workload_class.name, "none").inc()
            if view.snapshot.model_columns(query.model) is None:
                raise NotFound(f"model {query.model!r} is not served by any worker in the cluster")
            raise Unavailable(f"no healthy worker can take model {query.model!r} now; retry shortly")
        self.metrics.decided(query.workload_class, self._weights[query.workload_class], result)
        view.record_pick(result.row, query.workload_class, latency_tokens_of(query, result.cached_tokens))
        return result

    def list_nodes(self, node_ids: list[str]) -> placer_pb2.ListNodesReply:
        """The view's nodes (all, or just node_ids), flagged stale when Redis could not be read."""
        self.view.expire()
        nodes = self.view.nodes
        wanted = node_ids or sorted(nodes)
        return placer_pb2.ListNodesReply(
            nodes=[nodes[n].report for n in wanted if n in nodes], stale=self.view.stale
        )

    async def _flush_demand(self, window_s: float) -> None:
        while True:
            await asyncio.sleep(window_s)
            with contextlib.suppress(Exception):  # Redis down: counts stay local for the next flush
                await self.demand.flush(self.store, time.time(), window_s)
