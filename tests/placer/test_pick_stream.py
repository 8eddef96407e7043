"""Placer.PickStream over real gRPC against a real placer and Redis, through the gateway's PlacerLink:
each pick answered as a Pick call would be, bad picks failing alone, a broken call replaced."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from hanzo.inference.v1 import placer_pb2, placer_pb2_grpc
from services.common.channels import internal_channel
from services.common.internal_auth import call_metadata
from services.common.redis_server import RedisServer
from services.gateway.placer_link import PlacerLink
from services.placer.app import PlacerApp
from services.placer.pick_stream import MAX_CALLS
from tests.placer.cluster_helpers import eventually, node_report, placer_stub
from tests.placer.test_placer_service import pick_request, running_placer


@contextlib.asynccontextmanager
async def serving_placer(
    redis_url: str, **overrides: object
) -> AsyncIterator[tuple[PlacerApp, placer_pb2_grpc.PlacerStub]]:
    """A running placer and a stub on a channel to it."""
    async with running_placer(redis_url, **overrides) as app:
        channel, stub = placer_stub(app.address)
        async with channel:
            yield app, stub


async def test_concurrent_picks_each_get_their_own_answer(redis_server: RedisServer) -> None:
    async with serving_placer(redis_server.url) as (app, stub):
        await stub.Heartbeat(node_report("a", models=("llama-tiny",)))
        await stub.Heartbeat(node_report("b", models=("qwen-tiny",)))
        link = PlacerLink(stub)
        models = ["llama-tiny", "qwen-tiny"] * 50
        replies = await asyncio.gather(*(link.pick(pick_request(m), 10.0, {}) for m in models))
        assert [r.node_id for r in replies] == ["a", "b"] * 50  # answers matched to their picks
        unary = await stub.Pick(pick_request("qwen-tiny"))
        streamed = await link.pick(pick_request("qwen-tiny"), 10.0, {})
        assert (streamed.node_id, streamed.address, streamed.considered) == (
            unary.node_id, unary.address, unary.considered,
        )  # fmt: skip
        assert [c.node_id for c in streamed.candidates] == [c.node_id for c in unary.candidates]
        await link.close()
        picked = {"workload_class": "REALTIME_CHAT", "outcome": "picked"}
        assert app.metrics.registry.get_sample_value("hanzo_placer_picks_total", picked) == 102


async def test_a_bad_pick_fails_alone_with_the_status_a_pick_call_gets(redis_server: RedisServer) -> None:
    async with serving_placer(redis_server.url) as (_, stub):
        await stub.Heartbeat(node_report("a"))
        link = PlacerLink(stub)
        long_chain = pick_request()
        long_chain.prefix_chain.extend(range(65))
        bad = {
            "model: is empty": (placer_pb2.PickRequest(), grpc.StatusCode.INVALID_ARGUMENT),
            "prefix_chain: has 65 elements; send at most 64": (
                long_chain, grpc.StatusCode.INVALID_ARGUMENT,
            ),
            "'gpt-9' is not served by any worker": (pick_request("gpt-9"), grpc.StatusCode.NOT_FOUND),
        }  # fmt: skip
        picks = [link.pick(request, 10.0, {}) for request, _ in bad.values()]
        good = [link.pick(pick_request(), 10.0, {}) for _ in range(3)]
        outcomes = await asyncio.gather(*picks, *good, return_exceptions=True)
        for (words, (_, code)), outcome in zip(bad.items(), outcomes, strict=False):
            assert isinstance(outcome, grpc.aio.AioRpcError)
            assert outcome.code() == code and words in (outcome.details() or "")
        assert [o.node_id for o in outcomes[3:]] == ["a"] * 3  # type: ignore[union-attr]
        assert (await link.pick(pick_request(), 10.0, {})).node_id == "a"  # the call goes on
        await link.close()


async def test_a_message_over_the_limit_ends_the_call(redis_server: RedisServer) -> None:
    async with serving_placer(redis_server.url) as (_, stub):
        await stub.Heartbeat(node_report("a"))
        call = stub.PickStream()
        calls = [placer_pb2.PickCall(call_id=i, request=pick_request()) for i in range(2)]
        await call.write(placer_pb2.PickCalls(calls=calls))
        assert [a.reply.node_id for a in (await call.read()).answers] == ["a", "a"]
        too_many = [placer_pb2.PickCall(call_id=i, request=pick_request()) for i in range(MAX_CALLS + 1)]
        await call.write(placer_pb2.PickCalls(calls=too_many))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"has {MAX_CALLS + 1} picks in one PickCalls message; send at most {MAX_CALLS}" in (
            err.value.details() or ""
        )


async def test_the_internal_token_is_checked_when_the_call_opens(redis_server: RedisServer) -> None:
    async with serving_placer(redis_server.url, internal_token="s3cret") as (_, stub):
        await stub.Heartbeat(node_report("a"), metadata=call_metadata("s3cret"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await PlacerLink(stub).pick(pick_request(), 10.0, {})
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # the call ended before any answer
        assert "UNAUTHENTICATED" in (err.value.details() or "")
        link = PlacerLink(stub, call_metadata("s3cret"))
        assert (await link.pick(pick_request(), 10.0, {})).node_id == "a"
        await link.close()


async def test_a_pick_past_its_timeout_fails_and_the_link_goes_on(redis_server: RedisServer) -> None:
    async with serving_placer(redis_server.url) as (_, stub):
        await stub.Heartbeat(node_report("a"))
        link = PlacerLink(stub)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await link.pick(pick_request(), 1e-9, {})
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        waiter = asyncio.create_task(link.pick(pick_request(), 10.0, {}))
        await asyncio.sleep(0)
        waiter.cancel()  # a caller that went away: its answer, when it comes, is dropped
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (await link.pick(pick_request(), 10.0, {})).node_id == "a"
        await link.close()


async def test_a_placer_restart_fails_waiting_picks_and_the_next_call_is_new(
    redis_server: RedisServer,
) -> None:
    async with running_placer(redis_server.url) as first:
        port = int(first.address.rsplit(":", 1)[1])
        channel = internal_channel(first.address, reconnect_backoff_s=0.1)
        stub = placer_pb2_grpc.PlacerStub(channel)
        await stub.Heartbeat(node_report("a"))
        link = PlacerLink(stub)
        assert (await link.pick(pick_request(), 10.0, {})).node_id == "a"
    # The placer stopped: the call is broken, and a pick now fails as a Pick call to it would.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await link.pick(pick_request(), 10.0, {})
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    async with running_placer(redis_server.url, port=port):
        await stub.Heartbeat(node_report("a"), wait_for_ready=True, timeout=10)  # the channel reconnects

        async def picks_again() -> bool:
            try:
                return (await link.pick(pick_request(), 1.0, {})).node_id == "a"
            except grpc.aio.AioRpcError:
                return False

        await eventually(picks_again, 10, "a pick through the same link after the placer restarted")
        await link.close()
    await channel.close()


async def test_node_only_answers_the_node_without_explaining_it(redis_server: RedisServer) -> None:
    async with serving_placer(redis_server.url) as (app, stub):
        await stub.Heartbeat(node_report("a", running=60, kv_usage=0.9))
        await stub.Heartbeat(node_report("b"))
        explained = await stub.Pick(pick_request())
        assert [c.node_id for c in explained.candidates] == ["b", "a"]
        request = pick_request()
        request.node_only = True
        link = PlacerLink(stub)
        for reply in (await stub.Pick(request), await link.pick(request, 10.0, {})):
            assert (reply.node_id, reply.considered, len(reply.candidates)) == ("b", 2, 0)
        await link.close()
        # Each decision is still counted under the scorer that added most to the winner's total.
        registry = app.metrics.registry
        decisions = sum(
            sample.value
            for metric in registry.collect()
            if metric.name == "hanzo_placer_decisions"
            for sample in metric.samples
            if sample.name.endswith("_total")
        )
        assert decisions == 3
