"""The per-key token bucket on a clock the test moves: bursts, refill, the wait it reports, and keys
that do not share a bucket."""

from __future__ import annotations

import pytest

from services.common.errors import ResourceExhausted
from services.gateway.config import GatewaySettings
from services.gateway.rate_limit import RateLimiter
from tests.manual_clock import ManualClock

# (seconds since the start, caller, the wait refused with; None: admitted); rate 2/s, bursts of 3.
SCHEDULE = [
    (0.0, b"a", None),
    (0.0, b"a", None),
    (0.0, b"a", None),
    (0.0, b"a", 0.5),  # the burst is spent: the next token is half a second away
    (0.0, b"b", None),  # another key has its own bucket
    (0.25, b"a", 0.25),  # a refusal takes nothing, so the wait only shrinks
    (0.5, b"a", None),
    (0.5, b"a", 0.5),
    (10.0, b"a", None),  # refilled, but never past the burst
    (10.0, b"a", None),
    (10.0, b"a", None),
    (10.0, b"a", 0.5),
]


def test_bucket_admits_bursts_then_the_rate() -> None:
    clock = ManualClock(100.0)
    limiter = RateLimiter(2.0, 3, clock=clock)
    start = clock.now
    for at, caller, wait in SCHEDULE:
        clock.now = start + at
        if wait is None:
            limiter.admit(caller)
            continue
        with pytest.raises(ResourceExhausted, match="over its rate limit of 2 requests per second") as err:
            limiter.admit(caller)
        assert err.value.retry_after_s == pytest.approx(wait), (at, caller)


@pytest.mark.parametrize(
    ("environ", "rps", "burst"),
    [
        ({}, 0.0, 1),
        ({"HANZO_GATEWAY_RATE_LIMIT_RPS": "2.5"}, 2.5, 3),  # one second's worth, rounded up
        ({"HANZO_GATEWAY_RATE_LIMIT_RPS": "5", "HANZO_GATEWAY_RATE_LIMIT_BURST": "20"}, 5.0, 20),
    ],
)
def test_rate_limit_settings(environ: dict[str, str], rps: float, burst: int) -> None:
    settings = GatewaySettings.from_env(environ)
    assert (settings.rate_limit_rps, settings.burst) == (rps, burst)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"HANZO_GATEWAY_RATE_LIMIT_RPS": "-1"}, "must be >= 0"),
        ({"HANZO_GATEWAY_RATE_LIMIT_RPS": "fast"}, "is not a number"),
        ({"HANZO_GATEWAY_RATE_LIMIT_BURST": "0"}, "RATE_LIMIT_BURST=0: must be >= 1"),
    ],
)
def test_bad_rate_limit_settings_name_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GatewaySettings.from_env(environ)
