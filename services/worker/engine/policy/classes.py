"""Per-class service levels and the per-request hints the scheduler orders by."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from services.common.workload import WorkloadClass
from services.worker.engine.errors import InvalidRequestError


@dataclass(frozen=True, kw_only=True)
class ClassPolicy:
    """How the scheduler treats one workload class.

    priority: 0 is served first; a class with a smaller number may displace a larger one.
    ttft_slo_s / itl_slo_s: the time-to-first-token and inter-token targets the step budget defends
    (None: no latency SLO, the class only fills capacity). max_waiting: queued requests of the class
    before new ones are refused (None: no limit). queue_timeout_s: how long a request may wait for its
    first schedule before it is refused with a retry hint (None: it waits as long as it takes).
    """

    priority: int
    ttft_slo_s: float | None = None
    itl_slo_s: float | None = None
    max_waiting: int | None = None
    queue_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.priority < 0:
            raise ValueError(f"priority must be >= 0, got {self.priority}")
        for name in ("ttft_slo_s", "itl_slo_s", "queue_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None, got {value}")
        if self.max_waiting is not None and self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0 or None, got {self.max_waiting}")

    @property
    def latency_sensitive(self) -> bool:
        """True when the class has a latency SLO the step budget must defend."""
        return self.ttft_slo_s is not None or self.itl_slo_s is not None


# The mesh's default service levels per class. The SLOs are GPU numbers; a CPU deployment configures its own.
DEFAULT_CLASS_POLICIES: Mapping[WorkloadClass, ClassPolicy] = MappingProxyType(
    {
        WorkloadClass.REALTIME_CHAT: ClassPolicy(
            priority=0, ttft_slo_s=0.2, itl_slo_s=0.05, max_waiting=512, queue_timeout_s=5.0
        ),
        WorkloadClass.AGENT_TOOL: ClassPolicy(
            priority=1, ttft_slo_s=0.3, itl_slo_s=0.05, max_waiting=512, queue_timeout_s=10.0
        ),
        WorkloadClass.EMBEDDING: ClassPolicy(
            priority=1, ttft_slo_s=0.1, max_waiting=1024, queue_timeout_s=5.0
        ),
        WorkloadClass.UNSPECIFIED: ClassPolicy(priority=2),
        WorkloadClass.BATCH: ClassPolicy(priority=3, max_waiting=8192, queue_timeout_s=600.0),
    }
)


class PolicyName(enum.StrEnum):
    ADAPTIVE = "adaptive"  # classes, deadlines, tenants, adaptive budget, displacement
    FIFO = "fifo"  # arrival order, fixed budget: the plain continuous-batching baseline


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """The scheduling policy's knobs.

    latency_reserve: fraction of KV blocks, and of seats in the running set, that only latency-sensitive
    classes may take at admission (a prompt arriving mid-step runs nested only in free seats and blocks).
    expected_output_tokens: growth an admission must leave room for, beyond the prompt (capped by the
    request's max_tokens), so a new request does not force a preemption a few steps later.
    min_batched_tokens: the budget never shrinks below this (latency work always gets its own tokens).
    latency_memory_s: after the last latency-class request, how long steps stay short enough for the next
    one to arrive into a short step (traffic with a steady rate keeps coming); only without
    layer_preemption.
    layer_preemption: a latency-class prompt that arrives while a step runs gets a step of its own
    between that step's layers (when the engine is given a way to see arrivals mid-step, and free blocks
    and a seat are there), so steps need not stay short for arrivals' sake.
    itl_min_efficiency: an inter-token target shrinks steps only as far as their predicted tokens/s stays
    at least this share of the best step size's (0: as far as the target asks; 1: never below the most
    efficient size). What a short step cannot shrink (every running sequence's decode, the LM head's
    pass over its weights, per-step overhead) is the price of a smoother stream: on this project's
    2-core CPU a step near a 20 ms target runs at half the tokens/s of a 1024-token one, so the
    default keeps 90% (the throughput the adaptive policy promises batch work), and on a GPU, where
    step time is nearly flat up to a few hundred tokens, the bound leaves the target more room.
    First-token targets are never bounded this way: they are what the latency classes are promised.
    max_waiting: requests queued (every class together) before a new one is refused with
    AdmissionError, under either policy; None: no limit (each class's own max_waiting still applies
    under adaptive).
    """

    name: PolicyName = PolicyName.ADAPTIVE
    classes: Mapping[WorkloadClass, ClassPolicy] = field(default_factory=lambda: DEFAULT_CLASS_POLICIES)
    latency_reserve: float = 0.1
    expected_output_tokens: int = 64
    min_batched_tokens: int = 16
    latency_memory_s: float = 1.0
    layer_preemption: bool = True
    itl_min_efficiency: float = 0.9
    max_waiting: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", PolicyName(self.name))
        missing = [c.name for c in WorkloadClass if c not in self.classes]
        if missing:
            raise ValueError(f"classes has no policy for {', '.join(missing)}")
        if not 0.0 <= self.latency_reserve < 1.0:
            raise ValueError(f"latency_reserve must be in [0, 1), got {self.latency_reserve}")
        if self.expected_output_tokens < 0:
            raise ValueError(f"expected_output_tokens must be >= 0, got {self.expected_output_tokens}")
        if self.max_waiting is not None and self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0 or None, got {self.max_waiting}")
        if self.min_batched_tokens < 1:
            raise ValueError(f"min_batched_tokens must be >= 1, got {self.min_batched_tokens}")
        if not 0.0 <= self.itl_min_efficiency <= 1.0:
            raise ValueError(f"itl_min_efficiency must be in [0, 1], got {self.itl_min_efficiency}")
        if self.latency_memory_s < 0:
            raise ValueError(f"latency_memory_s must be >= 0, got {self.latency_memory_s}")


@dataclass(frozen=True)
class SchedulingHints:
    """What a caller says about one request's urgency.

    deadline: time.monotonic() by which the caller needs the request finished; orders requests of a
    class earliest-deadline-first (None: after every request with a deadline). ttft_slo_s overrides the
    class's TTFT target for this request. tenant: requests of one class share the engine by tenant.
    """

    workload: WorkloadClass = WorkloadClass.UNSPECIFIED
    tenant: str = ""
    deadline: float | None = None
    ttft_slo_s: float | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "workload", WorkloadClass(self.workload))
        except ValueError:
            raise InvalidRequestError(
                "workload_class", f"{self.workload!r} is not a workload class"
            ) from None
        if self.ttft_slo_s is not None and self.ttft_slo_s <= 0:
            raise InvalidRequestError("ttft_slo_s", f"must be > 0 or unset, got {self.ttft_slo_s}")


DEFAULT_HINTS = SchedulingHints()
