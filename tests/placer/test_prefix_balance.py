"""The prefix cost rule's balance threshold as a setting (HANZO_PLACER_PREFIX_BALANCE_REQUESTS and _RATIO,
HANZO_GATEWAY_PREFIX_BALANCE_*) reaching a real placer's picks."""

from __future__ import annotations

import re

import pytest

from services.common.redis_server import RedisServer
from services.gateway.config import GatewaySettings
from services.placer.config import PlacerSettings
from services.placer.pick.prefix_cost import DEFAULT_PREFIX_BALANCE, PrefixBalance
from tests.placer.test_pick_stream import serving_placer
from tests.placer.test_placer_service import agent_call, first_call_on_busy_holder


def test_the_threshold_comes_from_the_environment() -> None:
    assert PlacerSettings.from_env({}).prefix_balance == DEFAULT_PREFIX_BALANCE == PrefixBalance(32, 1.0001)
    set_both = {"HANZO_PLACER_PREFIX_BALANCE_REQUESTS": "64", "HANZO_PLACER_PREFIX_BALANCE_RATIO": "1.5"}
    assert PlacerSettings.from_env(set_both).prefix_balance == PrefixBalance(64, 1.5)
    gateway = GatewaySettings.from_env({"HANZO_GATEWAY_PREFIX_BALANCE_REQUESTS": "8"})
    assert gateway.prefix_balance == PrefixBalance(8, DEFAULT_PREFIX_BALANCE.ratio)
    with pytest.raises(ValueError, match=re.escape("HANZO_PLACER_PREFIX_BALANCE_RATIO='0.5' must be >= 1.0")):
        PlacerSettings.from_env({"HANZO_PLACER_PREFIX_BALANCE_RATIO": "0.5"})
    with pytest.raises(ValueError, match="HANZO_GATEWAY_PREFIX_BALANCE_REQUESTS='many' is not a number"):
        GatewaySettings.from_env({"HANZO_GATEWAY_PREFIX_BALANCE_REQUESTS": "many"})


@pytest.mark.parametrize(("balance", "kept"), [(DEFAULT_PREFIX_BALANCE, False), (PrefixBalance(100), True)])
async def test_a_session_follows_its_prefix_only_within_the_threshold(
    redis_server: RedisServer, balance: PrefixBalance, kept: bool
) -> None:
    """The holder of a session's 3,900 cached tokens runs 40 requests, the other worker none: past the
    default threshold the next call goes where the ranking sends it, within a wider one it stays."""
    async with serving_placer(redis_server.url, prefix_balance=balance) as (_, stub):
        await first_call_on_busy_holder(stub, running=40)
        assert ((await stub.Pick(agent_call(1, 2, 3))).node_id == "holder") is kept
