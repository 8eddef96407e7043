"""The seeded open-loop arrival trace of bench/mixed.py: batch documents that saturate one engine, plus
real-time chat and agent requests at steady (Poisson) rates over the whole trace, which outlasts the batch
backlog so that latency traffic keeps arriving until the last batch document is done under either policy."""

from __future__ import annotations

import random
from dataclasses import dataclass

from services.common.workload import WorkloadClass

# Ids below this are left out of prompts so no prompt holds pad/bos/eos (0, 1, 2 in Llama vocabularies).
FIRST_PROMPT_TOKEN_ID = 3

# Short names for the JSON report, in report order.
CLASS_NAMES = {
    WorkloadClass.REALTIME_CHAT: "realtime",
    WorkloadClass.AGENT_TOOL: "agent",
    WorkloadClass.BATCH: "batch",
}


@dataclass(frozen=True)
class ClassSpec:
    """One class's requests: inclusive (low, high) token ranges drawn uniformly, tenants drawn uniformly.

    rate_per_s: mean Poisson arrival rate over the whole trace (latency classes); None for batch, whose
    count and rate follow from the engine's measured capacity (see TraceSpec).
    """

    workload: WorkloadClass
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    tenants: int
    rate_per_s: float | None = None


@dataclass(frozen=True)
class TraceSpec:
    """Shape of a trace.

    duration_s: latency-class arrivals cover [0, duration_s). Batch documents arrive in the first
    batch_window of it, faster than the engine serves them, and hold batch_fill x (measured batch tokens/s)
    x duration_s tokens in all: an engine at full batch speed clears the backlog after about batch_fill of
    the trace, one at batch_fill x that speed by its end, with latency requests arriving all along.
    latency_share: the latency classes' rates are their nominal rate_per_s, scaled down (never up) where
    their tokens would take more than this share of the measured batch tokens/s: on a small model the
    nominal rates are light, on a real one on 2 cores they alone would saturate the engine and starve
    the batch documents the trace is about.
    """

    name: str
    duration_s: float
    realtime: ClassSpec
    agent: ClassSpec
    batch: ClassSpec
    batch_window: float = 0.3
    batch_fill: float = 0.45
    latency_share: float = 0.3

    def __post_init__(self) -> None:
        if self.realtime.rate_per_s is None or self.agent.rate_per_s is None:
            raise ValueError("latency classes need a rate_per_s")


def _spec(name: str, duration_s: float) -> TraceSpec:
    return TraceSpec(
        name=name,
        duration_s=duration_s,
        realtime=ClassSpec(WorkloadClass.REALTIME_CHAT, (16, 64), (16, 32), tenants=4, rate_per_s=4.0),
        agent=ClassSpec(WorkloadClass.AGENT_TOOL, (128, 384), (2, 8), tenants=2, rate_per_s=1.5),
        batch=ClassSpec(WorkloadClass.BATCH, (256, 768), (32, 128), tenants=3),
    )


FULL = _spec("full", 40.0)
QUICK = _spec("quick", 16.0)


@dataclass(frozen=True)
class TraceRequest:
    """One request of the trace; arrival_s is seconds after the trace starts."""

    request_id: str
    workload: WorkloadClass
    tenant: str
    arrival_s: float
    prompt: list[int]
    max_tokens: int

    @property
    def tokens(self) -> int:
        """Prompt plus requested output tokens: the work the request asks for (EOS is ignored)."""
        return len(self.prompt) + self.max_tokens


def make_trace(spec: TraceSpec, vocab_size: int, batch_tok_s: float, seed: int) -> list[TraceRequest]:
    """Deterministic in (spec, vocab_size, batch_tok_s, seed); sorted by arrival time.

    batch_tok_s: the engine's measured batch tokens/second (prompt + output), which sizes the batch load.
    """
    rng = random.Random(seed)
    requests = []
    scale = latency_rate_scale(spec, batch_tok_s)
    for cls in (spec.realtime, spec.agent):
        rate = (cls.rate_per_s or 0.0) * scale  # never 0: TraceSpec checks latency classes have a rate
        t = rng.expovariate(rate)
        while t < spec.duration_s:
            requests.append(_request(rng, cls, len(requests), t, vocab_size))
            t += rng.expovariate(rate)
    batch_tokens = spec.batch_fill * batch_tok_s * spec.duration_s
    docs: list[TraceRequest] = []
    total = 0
    while total < batch_tokens:
        docs.append(_request(rng, spec.batch, len(requests) + len(docs), 0.0, vocab_size))
        total += docs[-1].tokens
    # Poisson arrivals at the rate that spreads the documents over the batch window.
    rate = len(docs) / (spec.batch_window * spec.duration_s)
    t = 0.0
    for doc in docs:
        requests.append(TraceRequest(doc.request_id, doc.workload, doc.tenant, t, doc.prompt, doc.max_tokens))
        t += rng.expovariate(rate)
    return sorted(requests, key=lambda r: r.arrival_s)


def latency_rate_scale(spec: TraceSpec, batch_tok_s: float) -> float:
    """The factor (<= 1) on the latency classes' nominal rates: see TraceSpec.latency_share."""
    demand = sum(
        (cls.rate_per_s or 0.0) * (sum(cls.prompt_len) + sum(cls.output_len)) / 2
        for cls in (spec.realtime, spec.agent)
    )  # tokens/s the latency classes ask for at their nominal rates (mean lengths)
    return min(1.0, spec.latency_share * batch_tok_s / demand) if demand > 0 else 1.0


def make_requests(cls: ClassSpec, count: int, vocab_size: int, seed: int, prefix: str) -> list[TraceRequest]:
    """count requests shaped like cls, all arriving at 0, ids prefix-<i>: for warm-up and calibration."""
    rng = random.Random(seed)
    made = [_request(rng, cls, i, 0.0, vocab_size) for i in range(count)]
    return [
        TraceRequest(f"{prefix}-{r.request_id}", r.workload, r.tenant, 0.0, r.prompt, r.max_tokens)
        for r in made
    ]


def _request(rng: random.Random, cls: ClassSpec, index: int, arrival_s: float, vocab: int) -> TraceRequest:
    prompt_len = rng.randint(*cls.prompt_len)
    name = CLASS_NAMES[cls.workload]
    return TraceRequest(
        request_id=f"{name}-{index}",
        workload=cls.workload,
        tenant=f"{name}-tenant-{rng.randrange(cls.tenants)}",
        arrival_s=arrival_s,
        prompt=[rng.randrange(FIRST_PROMPT_TOKEN_ID, vocab) for _ in range(prompt_len)],
        max_tokens=rng.randint(*cls.output_len),
    )


def summarize(spec: TraceSpec, trace: list[TraceRequest], batch_tok_s: float) -> dict[str, object]:
    """JSON-ready description of the trace, so results from different traces are never confused."""
    scale = latency_rate_scale(spec, batch_tok_s)
    out: dict[str, object] = {
        "name": spec.name,
        "duration_s": spec.duration_s,
        "batch_window": spec.batch_window,
        "batch_fill": spec.batch_fill,
        "latency_share": spec.latency_share,
        "latency_rate_scale": round(scale, 4),
    }
    for cls in (spec.realtime, spec.agent, spec.batch):
        mine = [r for r in trace if r.workload is cls.workload]
        out[CLASS_NAMES[cls.workload]] = {
            "requests": len(mine),
            "rate_per_s": (cls.rate_per_s * scale)
            if cls.rate_per_s
            else len(mine) / (spec.batch_window * spec.duration_s),
            "prompt_len_range": list(cls.prompt_len),
            "output_len_range": list(cls.output_len),
            "tenants": cls.tenants,
            "tokens": sum(r.tokens for r in mine),
            "last_arrival_s": max((r.arrival_s for r in mine), default=None),
        }
    return out
