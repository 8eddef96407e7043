"""bench/chaos.py's judgement of each request against its reference, its seeded fault schedule, and how
it names the services of `hanzo-mesh up` it finds among their processes."""

from __future__ import annotations

import pytest

from bench.chaos_faults import KINDS, plan_faults
from bench.chaos_load import Outcome, Reference, judge
from bench.chaos_mesh import _service_name

REF = Reference(token_ids=(5, 6, 7, 8), text="a b c d")


def _outcome(transport: str, status: str, ids: list[int], text: str, usage: int | None = None) -> Outcome:
    first = 1.0 if (ids or text) else None
    return Outcome(transport, 0, 0.0, status, 2.0, first, ids, text, "w1", usage)


@pytest.mark.parametrize(
    ("outcome", "kind", "duplicated", "before_tokens"),
    [
        (_outcome("grpc", "OK", [5, 6, 7, 8], "a b c d"), "completed", 0, False),
        (_outcome("grpc", "OK", [5, 6, 9, 8], "a b x d"), "corrupted", 0, False),
        (_outcome("grpc", "OK", [5, 6, 5, 6, 7, 8], "a b a b c d"), "corrupted", 2, False),  # a repeat
        (_outcome("grpc", "UNAVAILABLE", [5, 6], "a b"), "failed_clean", 0, False),
        (_outcome("grpc", "UNAVAILABLE", [], ""), "failed_clean", 0, True),  # should have moved on
        (_outcome("grpc", "UNAVAILABLE", [5, 9], "a x"), "corrupted", 0, False),
        (_outcome("grpc", "LOST", [5], "a"), "lost", 0, False),
        (_outcome("http", "OK", [], "a b c d", 4), "completed", 0, False),
        (_outcome("http", "OK", [], "a b c d", 6), "completed", 2, False),  # the text hides the repeat
        (_outcome("http", "OK", [], "a b c", 4), "corrupted", 0, False),
        (_outcome("http", "HTTP_STREAM_APIError", [], "a b"), "failed_clean", 0, False),
        (_outcome("http", "HTTP_429", [], ""), "failed_clean", 0, True),
    ],
)  # fmt: skip
def test_judge(outcome: Outcome, kind: str, duplicated: int, before_tokens: bool) -> None:
    verdict = judge(outcome, REF, max_tokens=4)
    assert (verdict.kind, verdict.duplicated, verdict.before_tokens) == (kind, duplicated, before_tokens)


def test_fault_schedule_is_seeded_and_covers_every_kind_each_round() -> None:
    nodes = ["mesh-w1", "mesh-w2"]
    faults = plan_faults(7, nodes, first_s=5.0, spacing_s=20.0, until_s=200.0)
    assert faults == plan_faults(7, nodes, first_s=5.0, spacing_s=20.0, until_s=200.0)
    assert [f.at_s for f in faults] == [5.0 + 20.0 * i for i in range(10)]
    for first in (0, 5):
        assert sorted(f.kind for f in faults[first : first + 5]) == sorted(KINDS)
    for fault in faults:
        service = KINDS[fault.kind][0]
        assert fault.target == service or fault.target in (f"{service}:{n}" for n in nodes)


@pytest.mark.parametrize(
    ("argv", "environ", "name"),
    [
        (["/usr/bin/redis-server 127.0.0.1:6400"], [], "redis"),
        (["/x/python", "-m", "services.placer"], [], "placer"),
        (["/x/python", "-m", "services.gateway"], [], "gateway"),
        (["/x/python", "-m", "services.worker"], ["A=1", "HANZO_WORKER_NODE_ID=mesh-w2"], "worker:mesh-w2"),
        (["/x/python", "-m", "services.telemetry"], ["HANZO_TELEMETRY_NODE_ID=mesh-w1"], "telemetry:mesh-w1"),
        (["/bin/sh", "-c", "true"], [], None),
    ],
)
def test_service_names(argv: list[str], environ: list[str], name: str | None) -> None:
    assert _service_name(argv, environ) == name
