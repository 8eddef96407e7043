"""The prefix memo's capacity as a setting (HANZO_PLACER_PREFIX_CAPACITY, HANZO_GATEWAY_PREFIX_CAPACITY)
reaching a real placer's picks."""

from __future__ import annotations

import pytest

from services.common.redis_server import RedisServer
from services.gateway.config import GatewaySettings
from services.placer.config import PREFIX_CAPACITY, PlacerSettings
from tests.placer.cluster_helpers import node_report
from tests.placer.test_pick_stream import serving_placer
from tests.placer.test_placer_service import pick_request


def test_the_capacity_comes_from_the_environment() -> None:
    assert PlacerSettings.from_env({}).prefix_capacity == PREFIX_CAPACITY
    assert PlacerSettings.from_env({"HANZO_PLACER_PREFIX_CAPACITY": "0"}).prefix_capacity == 0
    assert GatewaySettings.from_env({"HANZO_GATEWAY_PREFIX_CAPACITY": "5000"}).prefix_capacity == 5000
    with pytest.raises(ValueError, match="HANZO_PLACER_PREFIX_CAPACITY"):
        PlacerSettings.from_env({"HANZO_PLACER_PREFIX_CAPACITY": "-1"})


@pytest.mark.parametrize(("capacity", "follows"), [(PREFIX_CAPACITY, True), (0, False)])
async def test_a_next_turn_follows_its_prefix_only_while_remembered(
    redis_server: RedisServer, capacity: int, follows: bool
) -> None:
    # Beats 5 s apart: at the suite's 0.2 s a node expires 0.6 s after its one beat, and a stall that
    # long before the second pick (it happened once in CI) leaves only the first pick's node to take it.
    placer = serving_placer(redis_server.url, prefix_capacity=capacity, heartbeat_interval_s=5.0)
    async with placer as (_, stub):
        await stub.Heartbeat(node_report("a"))
        await stub.Heartbeat(node_report("b"))
        first = pick_request()
        first.prefix_chain.extend([11, 12])
        placed = (await stub.Pick(first)).node_id
        # The next turn extends the prompt. The first pick counts as waiting on its node until that
        # node's next heartbeat, so only a remembered prefix takes the turn back there.
        second = pick_request()
        second.prefix_chain.extend([11, 12, 13])
        again = (await stub.Pick(second)).node_id
        assert (again == placed) is follows
