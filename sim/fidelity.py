"""The simulator configured as the local mesh, on a trace the real mesh also serves, and how far apart the
two come out: TTFT p50 / p99 and throughput per workload class.

The mesh as simulated: two "GPUs", one per worker, each a CPU profile fitted to this machine's measured
step times (sim/cpu_profile.py), both in one zone, in racks of their own, the callers (the gateway) in
the first worker's rack as `hanzo-mesh up` places them; every worker serves SmolLM2 (chat, agent and
batch alike) and MiniLM; routing by the placer's own policy (`ours`). Both sides serve the same trace
(sim/trace.py) with the same token counts and output lengths.

Figures per class, for both sides alike: TTFT from a request's arrival (a session's start, or a later
turn's send) to its first token (an embedding's whole answer); throughput as output tokens (requests, for
embeddings) completed within the trace's window, over the window. Errors are |sim - real| / real.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from services.common.workload import WorkloadClass
from sim.config import Models, SimConfig, WorkloadConfig
from sim.cpu_profile import cpu_profile
from sim.fleet import Cooling, FleetLayout, NetworkCosts
from sim.profiles import GpuProfile
from sim.request import Request
from sim.sharegpt import Conversation
from sim.simulation import Simulation
from sim.trace import Trace, TraceLimits, TraceWorkload, build_trace

CHAT_MODEL, EMBED_MODEL = "smollm2", "minilm"  # services/mesh/models.py's names
MESH_MODELS = Models(chat=CHAT_MODEL, batch=CHAT_MODEL, agent=(CHAT_MODEL,), embedding=EMBED_MODEL)
MESH_LAYOUT = FleetLayout(
    zones=1, hosts=2, gpus_per_host=1, hosts_per_rack=1, model_sets=(((CHAT_MODEL, EMBED_MODEL), 1.0),)
)
CALLER_RACK = "rack-0"  # the gateway's rack is worker-1's (services/mesh/stack.py)
MESH_NODES = ("mesh-w1", "mesh-w2")  # the real workers' node ids (services/mesh/stack.py), simulated GPU 0, 1
CLASSES = (
    WorkloadClass.REALTIME_CHAT,
    WorkloadClass.AGENT_TOOL,
    WorkloadClass.BATCH,
    WorkloadClass.EMBEDDING,
)
METRICS = ("ttft_p50_s", "ttft_p99_s", "throughput")
_DRAIN_S = 900.0  # the simulation runs on this long past the window, so every request of the trace completes


# sim/workload.py's generator scaled to two CPU workers: rates are sessions per second per worker.
_MESH_SCALE = {
    "chat_rate": 0.08, "agent_rate": 0.03, "batch_rate": 0.15, "embedding_rate": 0.1,
    "agent_tenants": 4, "batch_prompt_median": 300, "batch_output_median": 48,
}  # fmt: skip


SESSION_RATES = ("chat_rate", "agent_rate", "batch_rate", "embedding_rate")


def mesh_workload(window_s: float, load_scale: float = 1.0, **overrides: float) -> WorkloadConfig:
    """The fleet workload's generator at the local mesh's scale over window_s, every class's session rate
    times load_scale (the same mix, more or less of it), overrides on top."""
    scaled = {**_MESH_SCALE, **{rate: _MESH_SCALE[rate] * load_scale for rate in SESSION_RATES}}
    return replace(WorkloadConfig(duration_s=window_s), **{**scaled, **overrides})


def load_scale_of(workload: WorkloadConfig) -> float:
    """The load_scale mesh_workload made workload with (read off the chat rate, which it scales)."""
    return round(workload.chat_rate / _MESH_SCALE["chat_rate"], 6)


@dataclass(frozen=True)
class FidelityPlan:
    """The trace: what generates it, its seed, and the limits that fit it to a small model."""

    workload: WorkloadConfig
    seed: int = 0
    limits: TraceLimits = field(
        default_factory=lambda: TraceLimits(max_output=96, max_prompt=4096, max_embedding_tokens=256)
    )


@dataclass(frozen=True)
class Served:
    """One request as served, times in seconds from the start of the run; ttft_s None if it failed."""

    workload: WorkloadClass
    session: int
    turn: int
    arrival_s: float
    ttft_s: float | None
    done_s: float | None
    prompt: int
    output: int
    status: str = "OK"
    cached: int = 0  # prompt tokens served from the prefix cache
    preemptions: int = 0  # times its KV was dropped and recomputed (the simulated side's; the real
    # side's are counted per class by the workers' Prometheus counter)
    node: str = ""  # the worker that served it (MESH_NODES' names on both sides; "" if none did)


def make_trace(plan: FidelityPlan, conversations: list[Conversation]) -> Trace:
    zones = [f"zone-{z}" for z in range(MESH_LAYOUT.zones)]  # as sim/fleet.py names them
    return build_trace(
        plan.workload, MESH_LAYOUT.gpus, zones, conversations, plan.seed, MESH_MODELS, plan.limits
    )


def simulate(
    trace: Trace,
    profile: GpuProfile,
    seed: int,
    conversations: list[Conversation],
    network: NetworkCosts | None = None,
) -> tuple[list[Served], Simulation]:
    """The trace through the simulated mesh under the placer's policy; every request as served (those no
    worker took with their status and no times, as the real side records a failed one).
    network: the callers' costs (default: the fleet's wire, no serving-stack overhead)."""
    network = network or NetworkCosts()
    workload = WorkloadConfig(duration_s=trace.duration_s + _DRAIN_S)
    config = SimConfig(
        layout=MESH_LAYOUT, workload=workload, cooling=Cooling.NONE, profile=profile, seed=seed,
        caller_rack=CALLER_RACK, network=network,
    )  # fmt: skip
    replay = TraceWorkload(trace, MESH_MODELS)
    sim = Simulation(config, "ours", conversations, workload=replay)
    sim.run()
    network_s = network.round_trip_s(True)
    served = [_served(r, network_s) for r in replay.completed]
    served += [_served(r, network_s, failed=True) for r in sim.rejected]
    return served, sim


def _served(r: Request, network_s: float, failed: bool = False) -> Served:
    """A simulated request as the real side records one; failed: no worker took it, and the gateway
    answered RESOURCE_EXHAUSTED (every worker it tried was overloaded), with no times."""
    session, turn = r.follow_up  # type: ignore[misc]
    if failed:
        return Served(
            workload=r.workload,
            session=session.index,
            turn=turn,
            arrival_s=r.arrival_s,
            ttft_s=None,
            done_s=None,
            prompt=r.prompt,
            output=0,
            status="RESOURCE_EXHAUSTED",
        )
    return Served(
        workload=r.workload,
        session=session.index,
        turn=turn,
        arrival_s=r.arrival_s,
        ttft_s=r.first_token_s - r.arrival_s + network_s,
        done_s=r.done_s + network_s,
        prompt=r.prompt,
        output=r.output,
        cached=r.cached,
        preemptions=r.preemptions,
        node=MESH_NODES[r.gpu],
    )


def preemptions_by_class(served: Iterable[Served]) -> dict[str, int]:
    """Preemptions of the served requests, per class (lower-case names, as the JSON's classes)."""
    found = dict.fromkeys((wc.name.lower() for wc in WorkloadClass if wc != WorkloadClass.UNSPECIFIED), 0)
    for s in served:
        found[s.workload.name.lower()] += s.preemptions
    return found


def routing_shares(served: Iterable[Served]) -> dict[str, dict[str, float]]:
    """Per class, the share of its requests each worker served: where the placer sent the work, which
    the same code decides on both sides from what each side's timing shows it."""
    rows = [s for s in served if s.node]
    nodes = sorted({s.node for s in rows})
    out: dict[str, dict[str, float]] = {}
    for wc in CLASSES:
        mine = [s.node for s in rows if s.workload == wc]
        out[wc.name.lower()] = {n: round(mine.count(n) / len(mine), 4) for n in nodes} if mine else {}
    return out


def embeddings_beside_decoders(served: Iterable[Served]) -> list[tuple[int, float, bool]]:
    """(input tokens, seconds from send to answer, whether a decoder request was in flight on its worker
    as it arrived) of each answered embedding: what the request overhead is fitted on
    (serving_fit.request_overhead_s), since an embedding beside a working decoder shares its core
    (GpuProfile.encoder_core_share) and the simulated engine charges it so."""
    served = list(served)
    decoding: dict[str, list[tuple[float, float]]] = {}
    for s in served:
        if s.workload != WorkloadClass.EMBEDDING and s.done_s is not None:
            decoding.setdefault(s.node, []).append((s.arrival_s, s.done_s))
    return [
        (s.prompt, s.ttft_s, any(start <= s.arrival_s <= end for start, end in decoding.get(s.node, ())))
        for s in served
        if s.workload == WorkloadClass.EMBEDDING and s.ttft_s is not None
    ]


def offered_load(sim: Simulation) -> float:
    """The work served at the profile's best decode efficiency (a full set of seats at 512-token
    contexts), plus the prompts' compute, over the fleet's seconds in the trace's window."""
    profile = sim.config.profile
    cost = profile.model(CHAT_MODEL)
    rows = profile.max_running
    step = cost.base_s + rows * cost.per_row_s + rows * 512 * cost.per_context_token_s
    work = sum(e.prefill_compute_s + e.decoded_tokens * step / rows for e in sim.engines)
    window = sim.workload.trace.duration_s  # type: ignore[union-attr]
    return work / (len(sim.engines) * window)


def class_metrics(served: Iterable[Served], window_s: float) -> dict[str, dict[str, float | int | None]]:
    """Per class: requests, failed, TTFT p50 / p99, and throughput (output tokens, or requests for
    embeddings, completed within the window, per second)."""
    out: dict[str, dict[str, float | int | None]] = {}
    rows = list(served)
    for wc in CLASSES:
        mine = [s for s in rows if s.workload == wc]
        ok = [s for s in mine if s.ttft_s is not None and s.done_s is not None]
        ttft = np.array([s.ttft_s for s in ok], dtype=float)
        in_window = [s for s in ok if s.done_s <= window_s]  # type: ignore[operator]
        units = len(in_window) if wc == WorkloadClass.EMBEDDING else sum(s.output for s in in_window)
        out[wc.name.lower()] = {
            "requests": len(mine),
            "failed": len(mine) - len(ok),
            "prompt_tokens": sum(s.prompt for s in mine),
            "output_tokens": sum(s.output for s in mine),
            "cached_prompt_tokens": sum(s.cached for s in mine),
            "ttft_p50_s": float(np.percentile(ttft, 50)) if ttft.size else None,
            "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft.size else None,
            "throughput": units / window_s,
        }
    return out


def pooled_metrics(runs: list[list[Served]], window_s: float) -> dict[str, dict[str, float | int | None]]:
    """class_metrics over every run of one trace at once: TTFT percentiles of the pooled requests (over R
    runs, a class's p99 rests on R times as many requests), throughput the runs' mean."""
    pooled = class_metrics((s for run in runs for s in run), window_s)
    for figures in pooled.values():
        figures["throughput"] = float(figures["throughput"] or 0.0) / max(len(runs), 1)
    return pooled


def matched_metrics(
    served: list[Served], window_s: float, repeats: int
) -> dict[str, dict[str, float | int | None]]:
    """The simulated side's figures to set against real ones pooled over `repeats` runs of the trace: its
    one deterministic pass pooled as many times. A percentile of pooled runs sits at other ranks of the
    distinct requests than one run's does (of 67 chat turns, p99 interpolates between the two slowest; of
    three runs' 201, it is the slowest one's), so scoring the pass alone against the pool compares two
    different statistics."""
    return pooled_metrics([served] * repeats, window_s)


def metrics_on(
    calibration: Mapping[str, object],
    trace: Trace,
    seed: int,
    conversations: list[Conversation],
    network: NetworkCosts,
    repeats: int,
) -> dict[str, dict[str, float | int | None]]:
    """The simulated mesh's figures on a calibration record's CPU profile (sim/calibrate.py's or
    sim/serving_fit.py's), matched to real ones pooled over `repeats` runs (matched_metrics)."""
    served, _ = simulate(
        trace, cpu_profile(calibration, CHAT_MODEL, EMBED_MODEL), seed, conversations, network
    )
    return matched_metrics(served, trace.duration_s, repeats)


def relative_errors(
    real: Mapping[str, Mapping[str, float | int | None]], sim: Mapping[str, Mapping[str, float | int | None]]
) -> dict[str, dict[str, float | None]]:
    """|sim - real| / real per class and metric (None where either is missing or real is 0)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, measured in real.items():
        out[name] = {}
        for metric in METRICS:
            r, s = measured.get(metric), sim[name].get(metric)
            ok = isinstance(r, float | int) and isinstance(s, float | int) and r
            out[name][metric] = abs(s - r) / r if ok else None  # type: ignore[operator]
    return out


def headline(errors: Mapping[str, Mapping[str, float | None]], metric: str) -> float | None:
    """The worst class's error on metric (the target holds for each class, so the maximum decides)."""
    values = [e[metric] for e in errors.values() if e.get(metric) is not None]
    return max(values) if values else None  # type: ignore[type-var]


def headlines(errors: Mapping[str, Mapping[str, float | None]]) -> dict[str, float | None]:
    """Every metric's headline, keyed as the bench's JSON names them (fidelity_ttft_p50_error, ...)."""
    return {f"fidelity_{m.removesuffix('_s')}_error": headline(errors, m) for m in METRICS}


def weighted(
    errors: Mapping[str, Mapping[str, float | None]], real: Mapping[str, Mapping[str, object]], metric: str
) -> float | None:
    """The request-weighted mean of the classes' errors on metric (reported beside the maximum)."""
    pairs = [(e[metric], int(real[c]["requests"])) for c, e in errors.items() if e.get(metric) is not None]  # type: ignore[call-overload]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None  # type: ignore[operator]


def metric_ranges(
    runs: list[dict[str, dict[str, float | int | None]]],
) -> dict[str, dict[str, list[float] | None]]:
    """Per class and metric, [lowest, highest] over runs (class_metrics each, e.g. one per refit of the
    step costs); None where a run lacks the figure."""
    out: dict[str, dict[str, list[float] | None]] = {}
    for name in runs[0] if runs else {}:
        out[name] = {}
        for metric in METRICS:
            values = [run[name].get(metric) for run in runs]
            numbers = [float(v) for v in values if isinstance(v, float | int)]
            out[name][metric] = [min(numbers), max(numbers)] if len(numbers) == len(values) else None
    return out


def outside_range(
    real: Mapping[str, Mapping[str, float | int | None]],
    ranges: Mapping[str, Mapping[str, list[float] | None]],
) -> dict[str, dict[str, float | None]]:
    """Per class and metric, how far the real figure lies outside the simulated range, relative to the
    real figure (0 inside it; None where either is missing)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, measured in real.items():
        out[name] = {}
        for metric in METRICS:
            r, span = measured.get(metric), ranges.get(name, {}).get(metric)
            if not isinstance(r, float | int) or not r or span is None:
                out[name][metric] = None
                continue
            low, high = span
            out[name][metric] = max(low - r, r - high, 0.0) / r
    return out
