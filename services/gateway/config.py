"""Gateway settings: one typed object from HANZO_GATEWAY_* environment variables (all optional)."""

from __future__ import annotations

import enum
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.common.env import env_enum, env_float, env_int, env_optional_int, env_str
from services.common.internal_auth import token_from_env
from services.placer.config import PREFIX_CAPACITY, prefix_balance_from_env
from services.placer.pick.prefix_cost import DEFAULT_PREFIX_BALANCE, PrefixBalance


class Placement(enum.StrEnum):
    """EMBEDDED: run a placer replica in this process, fed from Redis like any placer (placers are
    stateless readers of it), and pick without a network hop: a Pick RPC was over half of what the
    gateway added to time to first token. REMOTE: ask the placer service per request, each pick a message
    on one long-lived PickStream call (placer_link.py)."""

    EMBEDDED = "embedded"
    REMOTE = "remote"


@dataclass(frozen=True)
class GatewaySettings:
    """api_keys empty: the gateway runs open (and says so at start). max_attempts: workers tried for one
    request while no token has been sent. zone/rack/hostname: where the gateway runs, for topology.
    http_port: the OpenAI-compatible HTTP front's port on host (0 picks a free one; None serves none).
    http_timeout_s: the longest an HTTP request may run (a caller's `timeout` header may only shorten
    it), so a hung request ends with 504. http_max_body_bytes: larger request bodies get 413.
    rate_limit_rps / rate_limit_burst: each API key's token bucket (rate_limit.py); 0 rps: no limit,
    burst None: the rate rounded up (one second's worth)."""

    host: str = "127.0.0.1"
    port: int = 50050
    metrics_port: int | None = None
    placer_address: str = "127.0.0.1:50051"
    api_keys: frozenset[str] = frozenset()
    max_attempts: int = 3
    pick_timeout_s: float = 2.0
    zone: str = ""
    rack: str = ""
    hostname: str = field(default_factory=socket.gethostname)
    drain_timeout_s: float = 10.0
    placement: Placement = Placement.EMBEDDED
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)  # may carry a password
    key_prefix: str = "hanzo"
    resync_interval_s: float = 5.0
    demand_window_s: float = 5.0
    prefix_capacity: int = PREFIX_CAPACITY  # the embedded replica's prefix memo, in chain elements
    prefix_balance: PrefixBalance = DEFAULT_PREFIX_BALANCE  # the embedded replica's, as the placer's
    http_port: int | None = 8000  # vLLM's default port, so OpenAI clients configured for it just work
    http_timeout_s: float = 600.0
    http_max_body_bytes: int = 8 * 1024 * 1024
    internal_token: str | None = field(default=None, repr=False)  # HANZO_INTERNAL_TOKEN (internal_auth.py)
    # A hung worker's calls fail once a keepalive ping goes unanswered this long (channels.py); its
    # node is then left out of this gateway's picks for eject_s (ejections.py; 0: never).
    worker_keepalive_s: float = 2.0
    eject_s: float = 5.0
    rate_limit_rps: float = 0.0
    rate_limit_burst: int | None = None

    def __post_init__(self) -> None:
        # A plain string (a caller building settings in code) becomes the member, or is refused.
        choices = "|".join(p.value for p in Placement)
        if self.placement not in list(Placement):
            raise ValueError(f"HANZO_GATEWAY_PLACEMENT={self.placement!r}: use {choices}")
        object.__setattr__(self, "placement", Placement(self.placement))
        if self.rate_limit_burst is not None and self.rate_limit_burst < 1:
            raise ValueError(f"HANZO_GATEWAY_RATE_LIMIT_BURST={self.rate_limit_burst}: must be >= 1")

    @property
    def burst(self) -> int:
        """Requests a key may send at once: rate_limit_burst, else one second's worth."""
        return self.rate_limit_burst or max(1, math.ceil(self.rate_limit_rps))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> GatewaySettings:
        """Settings from HANZO_GATEWAY_* variables; ValueError naming a malformed one."""
        p = "HANZO_GATEWAY_"
        keys = frozenset(k.strip() for k in environ.get(p + "API_KEYS", "").split(",") if k.strip())
        return cls(
            host=env_str(environ, p + "HOST", cls.host),
            port=env_int(environ, p + "PORT", cls.port, minimum=0),
            metrics_port=env_optional_int(environ, p + "METRICS_PORT"),
            placer_address=env_str(environ, p + "PLACER_ADDRESS", cls.placer_address),
            api_keys=keys,
            max_attempts=env_int(environ, p + "MAX_ATTEMPTS", cls.max_attempts, minimum=1),
            pick_timeout_s=env_float(environ, p + "PICK_TIMEOUT_S", cls.pick_timeout_s, 0.01),
            zone=env_str(environ, p + "ZONE", ""),
            rack=env_str(environ, p + "RACK", ""),
            hostname=env_str(environ, p + "HOSTNAME", socket.gethostname()),
            drain_timeout_s=env_float(environ, p + "DRAIN_TIMEOUT_S", cls.drain_timeout_s, 0.0),
            placement=env_enum(environ, p + "PLACEMENT", Placement.EMBEDDED),
            redis_url=env_str(environ, p + "REDIS_URL", cls.redis_url),
            key_prefix=env_str(environ, p + "KEY_PREFIX", cls.key_prefix),
            resync_interval_s=env_float(environ, p + "RESYNC_INTERVAL_S", cls.resync_interval_s, 0.01),
            demand_window_s=env_float(environ, p + "DEMAND_WINDOW_S", cls.demand_window_s, 0.01),
            prefix_capacity=env_int(environ, p + "PREFIX_CAPACITY", cls.prefix_capacity, minimum=0),
            prefix_balance=prefix_balance_from_env(environ, p),
            http_port=_http_port(environ, p + "HTTP_PORT"),
            http_timeout_s=env_float(environ, p + "HTTP_TIMEOUT_S", cls.http_timeout_s, 0.001),
            http_max_body_bytes=env_int(environ, p + "HTTP_MAX_BODY_BYTES", cls.http_max_body_bytes, 1),
            internal_token=token_from_env(environ),
            worker_keepalive_s=env_float(environ, p + "WORKER_KEEPALIVE_S", cls.worker_keepalive_s, 1.0),
            eject_s=env_float(environ, p + "EJECT_S", cls.eject_s, 0.0),
            rate_limit_rps=env_float(environ, p + "RATE_LIMIT_RPS", cls.rate_limit_rps, 0.0),
            rate_limit_burst=env_optional_int(environ, p + "RATE_LIMIT_BURST"),
        )


def _http_port(environ: Mapping[str, str], name: str) -> int | None:
    """Unset: 8000; empty or "off": no HTTP front; else a port (0: a free one)."""
    raw = environ.get(name)
    if raw is None:
        return GatewaySettings.http_port
    if raw.strip().lower() in ("", "off"):
        return None
    return env_int(environ, name, 0, minimum=0)
