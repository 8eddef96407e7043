"""The in-process placer of bench/placer.py: a real PlacerApp on the bench's event loop, its sync costs,
and PlacerReplica.pick measured while the loop keeps applying pub/sub events."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence

import numpy as np

from bench.placer_measure import Timed, inprocess_picks
from bench.placer_naive import NaivePicker
from bench.progress import log
from hanzo.inference.v1 import cluster_state_pb2, placer_pb2
from services.placer.app import PlacerApp
from services.placer.cluster.convert import node_record
from services.placer.config import PlacerSettings
from services.placer.pick import ClassWeights, Picker, PickResult
from services.placer.replica import PlacerReplica

BURST_S = 0.002  # picks run this long between yields to the event loop
SYNC_TIMEOUT_S = 120.0


class InProcessPlacer:
    """A started PlacerApp (its gRPC server on a free port, unused); counts the thermal events it applies."""

    def __init__(self, app: PlacerApp, initial_sync_s: float) -> None:
        self.app = app
        self.initial_sync_s = initial_sync_s
        self.events = 0
        apply_thermal = app.view.apply_thermal

        # An instance attribute shadows the method, so the view's event loop calls this counting wrapper.
        # Only pub/sub thermal events reach apply_thermal here: a resync stores thermal entries directly.
        def counting_thermal(node_id: str, entry: object) -> None:
            self.events += 1
            apply_thermal(node_id, entry)  # type: ignore[arg-type]

        app.view.apply_thermal = counting_thermal  # type: ignore[method-assign]

    @classmethod
    async def start(
        cls, redis_url: str, heartbeat_interval_s: float, resync_interval_s: float
    ) -> InProcessPlacer:
        """Start and wait until the view holds every worker in Redis and the event subscription is live."""
        settings = PlacerSettings(
            redis_url=redis_url,
            heartbeat_interval_s=heartbeat_interval_s,
            resync_interval_s=resync_interval_s,
        )
        app = PlacerApp(settings)
        start = time.perf_counter()
        await app.start()
        expected = await app.store.client.zcard(app.store.keys.nodes)
        while len(app.view.nodes) < expected or len(app.view.thermal) < expected:
            if time.perf_counter() - start > SYNC_TIMEOUT_S:
                await app.stop()
                raise RuntimeError(f"in-process view holds {len(app.view.nodes)} of {expected} workers")
            await asyncio.sleep(0.05)
        await app.view.wait_subscribed()
        return cls(app, time.perf_counter() - start)

    def sync_report(self) -> dict[str, float]:
        """Seconds from start until the view held every worker, and how many it holds."""
        return {
            "inprocess_initial_sync_s": round(self.initial_sync_s, 2),
            "view_nodes": len(self.app.view.nodes),
        }

    async def costs(self, requests: Sequence[placer_pb2.PickRequest]) -> dict[str, float]:
        """Median cost of one full resync (ms; it blocks the loop each resync interval), of view.expire()
        (us; PlacerReplica.pick calls it on every pick), of applying one thermal sample (us), one
        heartbeat that moved only the load (us; against the full record rewrite every heartbeat cost
        before ClusterState's fast path), and of Picker.pick alone (us) rescoring every row on every
        pick, as a placer without incremental rankings would (measure() reports how many rows the
        placer's own picker rescored instead)."""
        view = self.app.view
        picker = Picker(ClassWeights.from_config(self.app.settings.class_weights), incremental=False)
        resync_ms = []
        for _ in range(3):
            t0 = time.perf_counter()
            await view.resync()
            resync_ms.append((time.perf_counter() - t0) * 1e3)
        expire_us = []
        for _ in range(200):
            t0 = time.perf_counter_ns()
            view.expire()
            expire_us.append((time.perf_counter_ns() - t0) / 1e3)
        apply_us = []
        for node_id, entry in list(view.thermal.items())[:1000]:
            t0 = time.perf_counter_ns()
            view.apply_thermal(node_id, entry)  # what each pub/sub thermal event costs after decoding
            apply_us.append((time.perf_counter_ns() - t0) / 1e3)
        self.events -= len(apply_us)  # not events
        beat_us, full_us = [], []
        for entry in list(view.nodes.values())[:1000]:
            beat = cluster_state_pb2.NodeEntry()
            beat.CopyFrom(entry)
            beat.deadline_s += 1e-3  # newer, so it is taken
            beat.report.load.running += 1
            t0 = time.perf_counter_ns()
            view.apply_node(beat)  # a heartbeat that moved the load only: the fast path
            beat_us.append((time.perf_counter_ns() - t0) / 1e3)
            t0 = time.perf_counter_ns()
            view.snapshot.upsert(
                node_record(beat, view.thermal.get(beat.report.node_id))
            )  # every beat, before
            full_us.append((time.perf_counter_ns() - t0) / 1e3)
            # Back to the load Redis holds: a resync would not undo it (it rereads only changed bytes),
            # and naive_agreement compares this view with a picker reading Redis. A new message: the
            # view holds the one it was given.
            restore = cluster_state_pb2.NodeEntry()
            restore.CopyFrom(entry)
            restore.deadline_s = beat.deadline_s + 1e-3
            view.apply_node(restore)
        picker_us = []
        for i in range(1000):
            query = PlacerReplica.query_of(requests[i % len(requests)])
            t0 = time.perf_counter_ns()
            picker.pick(view.snapshot, query)
            picker_us.append((time.perf_counter_ns() - t0) / 1e3)
        return {
            "resync_ms": round(statistics.median(resync_ms), 1),
            "view_expire_us_p50": round(statistics.median(expire_us), 1),
            "apply_thermal_us_p50": round(statistics.median(apply_us), 1),
            "apply_heartbeat_us_p50": round(statistics.median(beat_us), 1),
            "apply_heartbeat_full_us_p50": round(statistics.median(full_us), 1),
            "picker_fresh_us_p50": round(statistics.median(picker_us), 1),
        }

    async def measure(
        self, requests: Sequence[placer_pb2.PickRequest], duration_s: float
    ) -> tuple[Timed, Timed, int, dict[str, float]]:
        """PlacerReplica.pick (what the Pick RPC runs) for duration_s with the compiled pick and as long
        with numpy's (the same decisions; a fresh Picker for each, warmed up), in alternating quarters so
        that both see the same drift; how many pub/sub thermal events the view applied meanwhile, and
        how many rows the compiled picker rescored: per pick, and how many picks rescored every row."""
        replica = self.app.replica
        weights = ClassWeights.from_config(self.app.settings.class_weights)
        pickers = {True: Picker(weights, compiled=True), False: Picker(weights, compiled=False)}
        latencies: dict[bool, list[Timed]] = {True: [], False: []}
        before = self.events
        full = rows = 0
        for quarter in range(4):
            compiled = quarter % 2 == 0
            replica.picker = pickers[compiled]
            await inprocess_picks(replica.pick, requests, 0.25, BURST_S)  # the tables catch up
            start_full, start_rows = replica.picker.full_rescores, replica.picker.rows_rescored
            latencies[compiled].append(await inprocess_picks(replica.pick, requests, duration_s / 2, BURST_S))
            if compiled:
                full += replica.picker.full_rescores - start_full
                rows += replica.picker.rows_rescored - start_rows
        timed = {c: Timed(np.concatenate([t.latencies_us for t in runs]), sum(t.wall_s for t in runs))
                 for c, runs in latencies.items()}  # fmt: skip
        per_pick = round(rows / max(timed[True].calls, 1), 1)
        rescored = {"rows_rescored_per_pick": per_pick, "full_rescores": full}
        return timed[True], timed[False], self.events - before, rescored

    async def stop(self) -> None:
        await self.app.stop(grace_s=0.5)


async def naive_agreement(
    placer: InProcessPlacer, naive: NaivePicker, requests: Sequence[placer_pb2.PickRequest]
) -> tuple[int, int]:
    """(agreeing, checked): requests (prefix chain cleared, so neither side's prefix memory matters) on which
    the naive picker finds the same best total and the same number of candidates as the placer's Picker
    on its view. Run while no telemetry flows, so both read the same state; the picks are not recorded
    in the view (PlacerReplica.choose would count each as waiting, which Redis never sees)."""
    agreed = 0
    picker = Picker(ClassWeights.from_config(placer.app.settings.class_weights))
    for request in requests:
        plain = placer_pb2.PickRequest()
        plain.CopyFrom(request)
        plain.ClearField("prefix_chain")
        ours = picker.pick(placer.app.view.snapshot, PlacerReplica.query_of(plain))
        theirs = await naive.pick(plain)
        if (
            ours is not None
            and theirs is not None
            and abs(ours.total - theirs.candidates[0].total) < 1e-9
            and ours.considered == theirs.considered
        ):
            agreed += 1
        else:  # on stderr, so a disagreement can be looked into
            log(
                f"naive disagrees: {plain.model} class {plain.workload_class} exclude "
                f"{list(plain.exclude_nodes)}: ours {_decision(ours)}, naive {_decision(theirs)}; "
                f"scores apart (ours, naive): {_scores_apart(ours, theirs)}"
            )
    return agreed, len(requests)


def _decision(result: PickResult | placer_pb2.PickReply | None) -> str:
    if result is None:
        return "none"
    total = result.total if isinstance(result, PickResult) else result.candidates[0].total
    return f"{result.node_id} total {total:.6f} of {result.considered} considered"


def _scores_apart(
    ours: PickResult | None, theirs: placer_pb2.PickReply | None
) -> dict[str, tuple[float, float]]:
    """The chosen node's scores on which the two differ, where both chose the same node."""
    if ours is None or theirs is None or ours.node_id != theirs.node_id:
        return {}
    mine, naive = ours.candidates[0].scores, theirs.candidates[0].scores
    return {
        name: (round(mine[name], 6), round(naive.get(name, 0.0), 6))
        for name in mine
        if abs(mine[name] - naive.get(name, 0.0)) > 1e-9
    }
