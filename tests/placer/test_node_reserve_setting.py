"""The node reserve as a placer setting (HANZO_PLACER_NODE_RESERVE_FRACTION, weighed through the weights
file) reaching a real placer's picks over gRPC."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hanzo.inference.v1 import common_pb2
from services.common.redis_server import RedisServer
from services.common.workload import WorkloadClass
from services.placer.config import PlacerSettings
from services.placer.pick import ClassWeights
from services.placer.pick.scorers import ScorerConfig
from tests.placer.cluster_helpers import node_report
from tests.placer.pick.test_node_reserve import _ids
from tests.placer.test_pick_stream import serving_placer
from tests.placer.test_placer_service import pick_request

BATCH, CHAT = common_pb2.WORKLOAD_CLASS_BATCH, common_pb2.WORKLOAD_CLASS_REALTIME_CHAT
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "weights" / "node_reserve.json"


def test_the_shipped_weights_file_keeps_batch_off_the_reserve_and_nothing_else() -> None:
    settings = PlacerSettings.from_env({"HANZO_PLACER_WEIGHTS_FILE": str(EXAMPLE)})
    weights = ClassWeights.from_config(settings.class_weights)
    reserve = {wc: weights.for_class(wc).get("node_reserve", 0.0) for wc in WorkloadClass}
    assert reserve.pop(WorkloadClass.BATCH) == 1.0
    assert set(reserve.values()) == {0.0}  # the latency classes find the reserve by load alone
    assert json.loads(EXAMPLE.read_text()) == {"BATCH": {"node_reserve": 1.0}}  # the rest: the defaults


def test_the_fraction_comes_from_the_environment() -> None:
    assert PlacerSettings.from_env({}).node_reserve_fraction == ScorerConfig().node_reserve_fraction == 0.0625
    assert PlacerSettings.from_env({"HANZO_PLACER_NODE_RESERVE_FRACTION": "0.4"}).node_reserve_fraction == 0.4
    for bad in ("1.5", "-0.1", "nan"):
        expected = f"HANZO_PLACER_NODE_RESERVE_FRACTION='{bad}' must lie in [0, 1]"
        with pytest.raises(ValueError, match=re.escape(expected)):
            PlacerSettings.from_env({"HANZO_PLACER_NODE_RESERVE_FRACTION": bad})
    with pytest.raises(ValueError, match="HANZO_PLACER_NODE_RESERVE_FRACTION='half' is not a number"):
        PlacerSettings.from_env({"HANZO_PLACER_NODE_RESERVE_FRACTION": "half"})


@pytest.mark.parametrize(("fraction", "reserved_takes_chat"), [(0.5, True), (0.0, False)])
async def test_batch_goes_around_the_reserve_and_chat_into_it(
    redis_server: RedisServer, fraction: float, reserved_takes_chat: bool
) -> None:
    """Two workers, one inside a half reserve and one outside it, the outside one a little busier: batch
    avoids the reserved one and chat prefers it. With no reserve, both go to the idler worker."""
    inside, outside = _ids(True, 1, fraction=0.5)[0], _ids(False, 1, fraction=0.5)[0]
    weights = {"BATCH": {"node_reserve": 1.0}, "REALTIME_CHAT": {"node_reserve": 0.3}}
    async with serving_placer(redis_server.url, class_weights=weights, node_reserve_fraction=fraction) as (
        _,
        stub,
    ):
        await stub.Heartbeat(node_report(inside))
        await stub.Heartbeat(node_report(outside, running=8, kv_usage=0.2))
        request = pick_request(cls=BATCH)
        request.node_only = True
        assert (await stub.Pick(request)).node_id == (outside if reserved_takes_chat else inside)
        await stub.Heartbeat(node_report(inside))  # the pick above no longer counts as waiting there
        chat = await stub.Pick(pick_request(cls=CHAT))
        assert chat.node_id == inside
        scores = {c.node_id: c.scores.get("node_reserve", 0.0) for c in chat.candidates}
        assert scores[inside] == (1.0 if reserved_takes_chat else 0.0)
