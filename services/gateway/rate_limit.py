"""Per-API-key rate limits, as a token bucket per key (what Envoy's local rate limit and OpenAI's
per-key request limits do): a key may send `burst` requests at once and `rate_per_s` a second after
that. A request over the limit is refused before any work with RESOURCE_EXHAUSTED, its RetryInfo (HTTP:
Retry-After) saying when the next token arrives, so a client that waits that long is served.

Buckets live in each gateway process: with N replicas behind a balancer a key gets up to N times the
rate. There is one bucket per configured key (or one for every caller of a gateway without keys), so
their number is bounded by the configuration, never by the traffic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from prometheus_client import Counter

from services.common.errors import ResourceExhausted
from services.gateway.auth import ApiKeys

ANONYMOUS = b""  # the one caller of a gateway that requires no key


class TokenBucket:
    """burst tokens when full, refilled at rate_per_s; each admitted request takes one."""

    __slots__ = ("burst", "rate_per_s", "tokens", "updated")

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = float(burst)
        self.updated = now

    def take(self, now: float) -> float:
        """0.0 when a token was taken; else the seconds until one will be there (nothing is taken, so a
        refused caller does not push its own next chance further away)."""
        self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.rate_per_s)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


class RateLimiter:
    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        refused: Counter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (rate_per_s > 0 and burst >= 1):
            raise ValueError(f"a rate limit needs rate_per_s > 0 and burst >= 1, got {rate_per_s}, {burst}")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.refused = refused
        self.clock = clock
        self._buckets: dict[bytes, TokenBucket] = {}

    def admit(self, caller: bytes) -> None:
        """Take one of caller's tokens, or raise ResourceExhausted with the wait until the next one."""
        now = self.clock()
        bucket = self._buckets.get(caller)
        if bucket is None:
            bucket = self._buckets[caller] = TokenBucket(self.rate_per_s, self.burst, now)
        wait_s = bucket.take(now)
        if wait_s:
            if self.refused is not None:
                self.refused.inc()
            raise ResourceExhausted(
                f"this API key is over its rate limit of {self.rate_per_s:g} requests per second "
                f"(bursts of {self.burst})",
                retry_after_s=wait_s,
            )


class Gatekeeper:
    """What both fronts call with each request's metadata (gRPC) or headers (HTTP) before its handler:
    the API-key check (Unauthenticated), then the caller's rate limit (ResourceExhausted)."""

    def __init__(self, keys: ApiKeys | None, limiter: RateLimiter | None) -> None:
        self.keys = keys
        self.limiter = limiter

    def __call__(self, metadata: Mapping[str, str]) -> None:
        caller = self.keys(metadata) if self.keys is not None else ANONYMOUS
        if self.limiter is not None:
            self.limiter.admit(caller)
