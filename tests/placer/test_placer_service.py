"""The placer over real gRPC against a real Redis: registry, picks, errors, expiry, Redis faults."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hanzo.inference.v1 import common_pb2, placer_pb2, placer_pb2_grpc, telemetry_pb2
from services.common.redis_server import RedisServer
from services.common.workload import WorkloadClass
from services.placer.app import FRESHNESS_CHECK, PlacerApp
from services.placer.config import PlacerSettings
from services.placer.pick.weights import ClassWeights
from tests.placer.cluster_helpers import eventually, gpu_sample, node_report, placer_stub

BEAT_S = 0.2  # heartbeat interval in these tests; nodes expire 3 beats after their last one


@contextlib.asynccontextmanager
async def running_placer(redis_url: str, **overrides: object) -> AsyncIterator[PlacerApp]:
    fields: dict[str, object] = {
        "port": 0,
        "heartbeat_interval_s": BEAT_S,
        "resync_interval_s": 0.1,
        "planner_interval_s": 0.3,
    }
    settings = PlacerSettings(redis_url=redis_url, **{**fields, **overrides})  # type: ignore[arg-type]
    app = PlacerApp(settings)
    await app.start()
    try:
        yield app
    finally:
        await app.stop(grace_s=0.5)


async def heartbeats(stub: object, reports: list[placer_pb2.NodeReport], stop: asyncio.Event) -> None:
    """Beat every BEAT_S like workers do, tolerating a placer that is briefly unhappy."""
    while not stop.is_set():
        for report in reports:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Heartbeat(report)  # type: ignore[attr-defined]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), BEAT_S)


def pick_request(
    model: str = "llama-tiny", cls: int = common_pb2.WORKLOAD_CLASS_REALTIME_CHAT
) -> placer_pb2.PickRequest:
    return placer_pb2.PickRequest(model=model, workload_class=cls)


async def test_heartbeat_list_and_pick(redis_server: RedisServer) -> None:
    async with running_placer(redis_server.url) as app:
        channel, stub = placer_stub(app.address)
        async with channel:
            await stub.Heartbeat(node_report("a", running=60, kv_usage=0.9))
            await stub.Heartbeat(node_report("b"))
            listed = await stub.ListNodes(placer_pb2.ListNodesRequest())
            assert sorted(n.node_id for n in listed.nodes) == ["a", "b"]
            reply = await stub.Pick(pick_request())
            assert reply.node_id == "b"  # the idle one
            assert reply.considered == 2 and not reply.stale
            assert reply.candidates[0].node_id == "b"
            assert {"load", "thermal_headroom", "model_affinity"} <= set(reply.candidates[0].scores)
        # The decision is counted under the scorer that added most to the winner's weighted total.
        weights = ClassWeights.defaults().for_class(WorkloadClass.REALTIME_CHAT)
        scores = reply.candidates[0].scores
        winner = max(scores, key=lambda name: scores[name] * weights[name])
        registry = app.metrics.registry
        chat = {"workload_class": "REALTIME_CHAT"}
        assert registry.get_sample_value("hanzo_placer_decisions_total", {**chat, "scorer": winner}) == 1
        assert registry.get_sample_value("hanzo_placer_picks_total", {**chat, "outcome": "picked"}) == 1
        assert registry.get_sample_value("hanzo_placer_pick_seconds_count", chat) == 1
        assert registry.get_sample_value("hanzo_placer_nodes") == 2
        assert registry.get_sample_value("hanzo_placer_snapshot_stale") == 0


async def test_picks_count_as_waiting_until_the_next_heartbeat(redis_server: RedisServer) -> None:
    """Between two heartbeats the placer counts its own picks, so a burst spreads over equally idle
    nodes instead of piling onto whichever ranked first; a heartbeat then reports the real queue."""
    async with running_placer(redis_server.url) as app:
        channel, stub = placer_stub(app.address)
        async with channel:
            nodes = ["a", "b", "c"]
            for running, node in enumerate(nodes):  # a is the least loaded, then b, then c
                await stub.Heartbeat(node_report(node, host="h", rack="r", running=running))
            # Uncounted, all six would go to a; counted, a takes one, then a and b one each, and once
            # all three hold 2 the last three picks go one to each.
            burst = [(await stub.Pick(pick_request())).node_id for _ in range(6)]
            assert sorted(set(burst)) == nodes and burst.count("c") == 1
            for node in nodes:  # all three report an empty queue, except "c" with a long one
                await stub.Heartbeat(node_report(node, host="h", rack="r", waiting=40 if node == "c" else 0))
            after = {(await stub.Pick(pick_request())).node_id for _ in range(2)}
            assert after == {"a", "b"}


def agent_call(*chain: int) -> placer_pb2.PickRequest:
    """An agent session's call whose prefix chain is chain, its elements ending at 2,000 tokens (the
    tenant's tools), 3,900 (the first call's prompt), then 100 more each."""
    request = pick_request(cls=common_pb2.WORKLOAD_CLASS_AGENT_TOOL)
    request.prefix_chain.extend(chain)
    request.prefix_chain_tokens.extend([2_000, 3_900, 4_000, 4_100, 4_200][: len(chain)])
    return request


async def first_call_on_busy_holder(stub: placer_pb2_grpc.PlacerStub, running: int) -> placer_pb2.NodeReport:
    """Workers "holder" (running requests, 500 latency prompt tokens queued) and "idle" beat; a session's
    first call goes to holder (idle excluded), whose next beat then no longer counts it. Returns
    holder's report."""
    busy = node_report("holder", running=running, kv_usage=0.6)
    busy.load.latency_prompt_tokens = 500
    await stub.Heartbeat(busy)
    await stub.Heartbeat(node_report("idle"))
    first = agent_call(1, 2)
    first.exclude_nodes.append("idle")
    assert (await stub.Pick(first)).node_id == "holder"
    await stub.Heartbeat(busy)
    return busy


async def test_an_agent_call_stays_with_its_history_unless_the_queue_there_costs_more(
    redis_server: RedisServer,
) -> None:
    """The prefix cost rule over gRPC, fed by heartbeats through Redis: a busy worker holding a session's
    3,900 cached tokens keeps its next call while its latency prefill is short, and loses it once the
    queue there costs more than computing the whole prompt on the idle worker. Until the next heartbeat
    the placer counts a kept call's uncached tokens only, as the worker will count it, so the session's
    call after it stays too."""
    async with running_placer(redis_server.url) as app:
        channel, stub = placer_stub(app.address)
        async with channel:
            busy = await first_call_on_busy_holder(stub, running=24)
            kept = await stub.Pick(agent_call(1, 2, 3))
            assert kept.node_id == "holder"
            assert [c.node_id for c in kept.candidates][:2] == ["holder", "idle"]  # the ranked winner second
            labels = {"workload_class": "AGENT_TOOL", "scorer": "prefix_cost"}
            assert app.metrics.registry.get_sample_value("hanzo_placer_decisions_total", labels) == 1
            # 500 + the kept call's 100 + this one's 100 there, against 4,100 on the idle worker.
            assert (await stub.Pick(agent_call(1, 2, 3, 4))).node_id == "holder"
            busy.load.latency_prompt_tokens = 10_000
            await stub.Heartbeat(busy)
            assert (await stub.Pick(agent_call(1, 2, 3, 4, 5))).node_id == "idle"


@pytest.mark.parametrize(
    ("call", "code", "words"),
    [
        ("heartbeat_no_id", grpc.StatusCode.INVALID_ARGUMENT, "node_id"),
        ("heartbeat_no_address", grpc.StatusCode.INVALID_ARGUMENT, "address"),
        ("pick_no_model", grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ("pick_bad_class", grpc.StatusCode.INVALID_ARGUMENT, "workload_class"),
        ("pick_long_chain", grpc.StatusCode.INVALID_ARGUMENT, "prefix_chain: has 65 elements"),
        (
            "pick_chain_ends_short",
            grpc.StatusCode.INVALID_ARGUMENT,
            "prefix_chain_tokens: has 1 entries for 2",
        ),
        (
            "pick_chain_ends_decrease",
            grpc.StatusCode.INVALID_ARGUMENT,
            "prefix_chain_tokens: must not decrease",
        ),
        ("pick_unknown_model", grpc.StatusCode.NOT_FOUND, "not served by any worker"),
    ],
)
async def test_bad_requests_get_precise_statuses(
    redis_server: RedisServer, call: str, code: grpc.StatusCode, words: str
) -> None:
    async with running_placer(redis_server.url) as app:
        channel, stub = placer_stub(app.address)
        async with channel:
            await stub.Heartbeat(node_report("a"))
            no_address = node_report("x")
            no_address.address = ""
            long_chain = pick_request()
            long_chain.prefix_chain.extend(range(1, 66))
            ends_short, ends_decrease = pick_request(), pick_request()
            for request, ends in ((ends_short, [128]), (ends_decrease, [256, 128])):
                request.prefix_chain.extend([1, 2])
                request.prefix_chain_tokens.extend(ends)
            calls = {
                "heartbeat_no_id": lambda: stub.Heartbeat(node_report("")),
                "heartbeat_no_address": lambda: stub.Heartbeat(no_address),
                "pick_no_model": lambda: stub.Pick(pick_request(model="")),
                "pick_bad_class": lambda: stub.Pick(pick_request(cls=42)),
                "pick_long_chain": lambda: stub.Pick(long_chain),
                "pick_chain_ends_short": lambda: stub.Pick(ends_short),
                "pick_chain_ends_decrease": lambda: stub.Pick(ends_decrease),
                "pick_unknown_model": lambda: stub.Pick(pick_request(model="gpt-9")),
            }
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await calls[call]()
            assert err.value.code() == code
            assert words in err.value.details()
            # The node accepted before is still there.
            assert [n.node_id for n in (await stub.ListNodes(placer_pb2.ListNodesRequest())).nodes] == ["a"]


async def test_node_is_gone_within_its_ttl_after_heartbeats_stop(redis_server: RedisServer) -> None:
    async with running_placer(redis_server.url) as app:
        channel, stub = placer_stub(app.address)
        async with channel:
            await stub.Heartbeat(node_report("short-lived"))
            await stub.Heartbeat(node_report("steady"))
            stop = asyncio.Event()
            beating = asyncio.create_task(heartbeats(stub, [node_report("steady")], stop))

            async def gone() -> bool:
                listed = await stub.ListNodes(placer_pb2.ListNodesRequest())
                return [n.node_id for n in listed.nodes] == ["steady"]

            took = await eventually(gone, timeout_s=5, what="short-lived node dropped")
            assert took <= app.settings.node_ttl_s + 0.5
            client = aioredis.Redis.from_url(redis_server.url)
            assert await client.exists("hanzo:node:short-lived") == 0  # Redis expired it by itself
            await client.aclose()
            stop.set()
            await beating


async def test_redis_down_picks_continue_then_restart_rebuilds(redis_server: RedisServer) -> None:
    async with running_placer(redis_server.url) as app:
        channel, stub = placer_stub(app.address)
        health = health_pb2_grpc.HealthStub(channel)
        reports = [node_report(f"n{i}") for i in range(4)]
        stop = asyncio.Event()
        beating = asyncio.create_task(heartbeats(stub, reports, stop))
        async with channel:
            await eventually(lambda: _has_nodes(stub, 4), 5, "4 nodes registered")
            redis_server.stop()

            async def stale() -> bool:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=FRESHNESS_CHECK))
                return reply.status == health_pb2.HealthCheckResponse.NOT_SERVING

            await eventually(stale, 10, "placer reports a stale snapshot")
            registry = app.metrics.registry
            assert registry.get_sample_value("hanzo_placer_snapshot_stale") == 1

            async def aged() -> bool:  # nothing heard from Redis for longer than 3 resync intervals
                return (registry.get_sample_value("hanzo_placer_view_age_seconds") or 0) > 0.3

            await eventually(aged, 10, "the view's age grows while Redis is gone")
            for _ in range(20):
                reply = await stub.Pick(pick_request())
                assert reply.stale and reply.node_id in {r.node_id for r in reports}
            age_while_down = registry.get_sample_value("hanzo_placer_view_age_seconds")
            redis_server.start()  # empty: no persistence, like a crashed cache
            client = aioredis.Redis.from_url(redis_server.url)

            async def rebuilt() -> bool:
                keys = await client.keys("hanzo:node:*")
                return len(keys) == 4

            took = await eventually(rebuilt, 10, "registry rebuilt after the restart")
            assert took <= BEAT_S + 1.0
            await eventually(lambda: _fresh(stub), 10, "snapshot fresh again")
            assert registry.get_sample_value("hanzo_placer_snapshot_stale") == 0
            assert registry.get_sample_value("hanzo_placer_view_age_seconds") < age_while_down
            await client.flushall()
            took = await eventually(rebuilt, 10, "registry rebuilt after a flush")
            assert took <= BEAT_S + 1.0  # one heartbeat, plus slack for a loaded CI machine
            await client.aclose()
            # Stop beating before the channel closes: closing it cancels a heartbeat in flight.
            stop.set()
            await beating


async def test_telemetry_steers_realtime_away_from_a_throttled_gpu(redis_server: RedisServer) -> None:
    async with running_placer(redis_server.url) as app:
        channel, stub = placer_stub(app.address)
        async with channel:
            # "hot" is the least loaded, but its GPU reports a thermal slowdown.
            await stub.Heartbeat(node_report("hot", running=0))
            await stub.Heartbeat(node_report("cool", running=20, kv_usage=0.3))

            async def samples() -> AsyncIterator[telemetry_pb2.TelemetryReport]:
                yield telemetry_pb2.TelemetryReport(node_id="hot", samples=[gpu_sample(89.0, reasons=0x20)])
                yield telemetry_pb2.TelemetryReport(node_id="cool", samples=[gpu_sample(55.0)])

            ack = await stub.StreamTelemetry(samples())
            assert ack.samples_accepted == 2
            realtime = await stub.Pick(pick_request())
            assert realtime.node_id == "cool"
            batch = [await stub.Pick(pick_request(cls=common_pb2.WORKLOAD_CLASS_BATCH)) for _ in range(5)]
            assert {b.node_id for b in batch} <= {"hot", "cool"}


async def test_demand_makes_the_planner_ask_for_a_replica(redis_server: RedisServer) -> None:
    # The two nodes beat only between polls of ten picks: at BEAT_S they would expire after 0.6 s, which
    # a slow machine's poll can outlast (CI once saw every pick refused as no node was healthy).
    async with running_placer(redis_server.url, replica_capacity_rps=5.0, heartbeat_interval_s=2.0) as app:
        channel, stub = placer_stub(app.address)
        async with channel:
            await stub.Heartbeat(node_report("has-it", models=("llama-tiny",)))
            # "empty" lists the model in its catalog (not resident): a worker loads only what it has.
            await stub.Heartbeat(node_report("empty", models=(), catalog=("llama-tiny",)))

            async def asked_to_load() -> bool:
                for _ in range(10):  # 10 picks per poll: well past 5 rps per replica
                    await stub.Pick(pick_request())
                reply = await stub.Heartbeat(node_report("empty", models=(), catalog=("llama-tiny",)))
                await stub.Heartbeat(node_report("has-it", models=("llama-tiny",)))
                return list(reply.load_models) == ["llama-tiny"]

            await eventually(asked_to_load, 10, "planner asks the empty node to load the busy model")


async def _has_nodes(stub: object, count: int) -> bool:
    listed = await stub.ListNodes(placer_pb2.ListNodesRequest())  # type: ignore[attr-defined]
    return len(listed.nodes) == count


async def _fresh(stub: object) -> bool:
    listed = await stub.ListNodes(placer_pb2.ListNodesRequest())  # type: ignore[attr-defined]
    return not listed.stale
