"""Placer settings: one typed object from HANZO_PLACER_* environment variables (all optional)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.common.env import env_float, env_int, env_optional_int, env_str
from services.common.internal_auth import token_from_env
from services.placer.pick.prefix_cost import DEFAULT_PREFIX_BALANCE, PrefixBalance
from services.placer.pick.scorers import ScorerConfig

# Prefix chain elements a replica's memo remembers at most: about 90 s of the chains the simulator's
# workload sends from 1,000 GPUs (34 elements a second per GPU, four fifths of them batch documents that
# no later prompt repeats), where 99.6% of chats' later turns (20 s think times) still find their history
# (100,000, the earlier figure, kept 17%); about 130 bytes an element, ~390 MB when full, and a memo only
# fills as traffic comes. python -m sim.memo_reach measures what a capacity keeps (docs/simulator.md,
# "How long the prefix memo remembers").
PREFIX_CAPACITY = 3_000_000


@dataclass(frozen=True)
class PlacerSettings:
    """host/port: gRPC listen address; 50051 by default, where telemetry and workers look; 0 picks a free
    port. metrics_port: Prometheus HTTP port, None for none, 0 for a free one. Nodes expire
    node_ttl_factor heartbeat intervals after their last beat. class_weights: per workload class name,
    scorer name -> weight; classes not given keep the defaults. The replica planner sizes each model's
    replicas as its demand over replica_capacity_rps, or over model_capacity_rps[model] where given."""

    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int | None = None
    # May carry a password (redis://:PASSWORD@host:port/0): out of repr, shown through redact_url.
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)
    key_prefix: str = "hanzo"
    heartbeat_interval_s: float = 1.0
    node_ttl_factor: float = 3.0
    # Events keep the view fresh; the resync only repairs what pub/sub lost (and costs ~O(nodes)).
    resync_interval_s: float = 5.0
    planner_interval_s: float = 5.0
    replica_capacity_rps: float = 20.0
    model_capacity_rps: dict[str, float] = field(default_factory=dict)
    class_weights: dict[str, dict[str, float]] = field(default_factory=dict)
    internal_token: str | None = field(default=None, repr=False)  # HANZO_INTERNAL_TOKEN (internal_auth.py)
    prefix_capacity: int = PREFIX_CAPACITY  # HANZO_PLACER_PREFIX_CAPACITY, elements
    # HANZO_PLACER_PREFIX_BALANCE_REQUESTS and _RATIO: where the prefix cost rule stops following a prefix
    prefix_balance: PrefixBalance = DEFAULT_PREFIX_BALANCE
    # HANZO_PLACER_NODE_RESERVE_FRACTION: the nodes the node_reserve scorer keeps for the latency classes,
    # where class_weights weigh it (scorers.node_reserve)
    node_reserve_fraction: float = ScorerConfig.node_reserve_fraction

    @property
    def node_ttl_s(self) -> float:
        return self.heartbeat_interval_s * self.node_ttl_factor

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PlacerSettings:
        """Settings from HANZO_PLACER_* variables; ValueError naming a malformed one."""
        p = "HANZO_PLACER_"
        weights_file = environ.get(p + "WEIGHTS_FILE")
        weights = json.loads(Path(weights_file).read_text()) if weights_file else {}
        return cls(
            host=env_str(environ, p + "HOST", cls.host),
            port=env_int(environ, p + "PORT", cls.port, minimum=0),
            metrics_port=env_optional_int(environ, p + "METRICS_PORT"),
            redis_url=env_str(environ, p + "REDIS_URL", cls.redis_url),
            key_prefix=env_str(environ, p + "KEY_PREFIX", cls.key_prefix),
            heartbeat_interval_s=env_float(
                environ, p + "HEARTBEAT_INTERVAL_S", cls.heartbeat_interval_s, 0.01
            ),
            node_ttl_factor=env_float(environ, p + "NODE_TTL_FACTOR", cls.node_ttl_factor, 1.0),
            resync_interval_s=env_float(environ, p + "RESYNC_INTERVAL_S", cls.resync_interval_s, 0.01),
            planner_interval_s=env_float(environ, p + "PLANNER_INTERVAL_S", cls.planner_interval_s, 0.01),
            replica_capacity_rps=env_float(
                environ, p + "REPLICA_CAPACITY_RPS", cls.replica_capacity_rps, 0.001
            ),
            model_capacity_rps=_model_capacities(environ, p + "MODEL_CAPACITY_RPS"),
            class_weights=weights,
            internal_token=token_from_env(environ),
            prefix_capacity=env_int(environ, p + "PREFIX_CAPACITY", cls.prefix_capacity, minimum=0),
            prefix_balance=prefix_balance_from_env(environ, p),
            node_reserve_fraction=_fraction(environ, p + "NODE_RESERVE_FRACTION", cls.node_reserve_fraction),
        )


def _fraction(environ: Mapping[str, str], name: str, default: float) -> float:
    """A share in [0, 1] from environ[name]; ValueError naming the variable otherwise."""
    value = env_float(environ, name, default)
    if not 0.0 <= value <= 1.0:  # NaN too
        raise ValueError(f"{name}={environ[name]!r} must lie in [0, 1] (a share of the nodes)")
    return value


def prefix_balance_from_env(environ: Mapping[str, str], prefix: str) -> PrefixBalance:
    """The prefix cost rule's balance threshold from prefix + PREFIX_BALANCE_REQUESTS (requests, >= 0)
    and prefix + PREFIX_BALANCE_RATIO (>= 1); ValueError naming a malformed one."""
    default = DEFAULT_PREFIX_BALANCE
    return PrefixBalance(
        env_float(environ, prefix + "PREFIX_BALANCE_REQUESTS", default.requests, 0.0),
        env_float(environ, prefix + "PREFIX_BALANCE_RATIO", default.ratio, 1.0),
    )


def _model_capacities(environ: Mapping[str, str], name: str) -> dict[str, float]:
    """A JSON object of model name -> requests per second one replica serves ({"llama-70b": 1.5});
    ValueError naming the variable for anything else."""
    text = environ.get(name, "").strip()
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        example = '{"llama-70b": 1.5}'
        raise ValueError(f"{name} is not JSON ({error}); give an object such as {example}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{name} must be a JSON object of model -> requests per second, got {text!r}")
    capacities = {}
    for model, rps in parsed.items():
        if isinstance(rps, bool) or not isinstance(rps, int | float) or not rps > 0:
            raise ValueError(f"{name}: {model!r} must be a number of requests per second > 0, got {rps!r}")
        capacities[str(model)] = float(rps)
    return capacities
