"""A CPU mesh's steps slow down with the requests in flight on its shared cores; fitted from step logs.

The local mesh runs both workers, the gateway, the placer, Redis and the client on two cores. A worker's
step computes on its core while the rest take their share of both: the gateway and the client handle
every token of every request in flight, and the other worker computes beside it. Over fidelity run 19's
calibration trace, the steps' measured over predicted time (summed) rose from 0.91 with at most one
request in the mesh to 1.07 with sixteen or more; a linear fit takes that in as a larger cost per
decode row (1.2 ms, where the offline fit, a process alone, finds none), which is wrong both when the
mesh is quiet and at its peak. So the step time is modelled as the linear terms times
(1 + slowdown x requests in flight), the requests counted as the engines' own queues count them (every
decoder's running and waiting sequences as its step began, summed over the workers), and the simulator
slows every engine of the mesh by that factor (Simulation: GpuProfile.host_slowdown_per_request).

The factor is fitted with the step costs: for each slowdown of a grid, the linear terms fitted to the
steps' seconds / (1 + slowdown x requests); the slowdown whose fit leaves the least RMS relative residual
wins (the grid's step, 0.0025 a request, is finer than the residual tells apart).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import replace

from sim.fit import Fit, StepSample, fit_step_costs

SLOWDOWN_GRID = tuple(i * 0.0025 for i in range(21))  # 0 to 0.05 per request in flight


def in_flight_per_step(logs: Sequence[Sequence[Mapping[str, object]]]) -> list[list[int]]:
    """For each step of each decoder's log (records as step_log.py writes them, in time order), the
    requests in flight in the mesh as it ran: its own engine's running and waiting sequences, plus each
    other log's as of the step of theirs running at this step's midpoint (none where that log was idle)."""
    spans = [_spans(log) for log in logs]
    counts = []
    for i, log in enumerate(logs):
        own = []
        for record in log:
            middle = midpoint(record)
            others = sum(_queued_at(other, spans[j], middle) for j, other in enumerate(logs) if j != i)
            own.append(_queued(record) + others)
        counts.append(own)
    return counts


def in_flight_at(logs: Sequence[Sequence[Mapping[str, object]]], moments: Sequence[float]) -> list[int]:
    """The requests in flight in the mesh at each of moments (wall-clock seconds), by every decoder's
    log as in_flight_per_step counts the other workers: the queues of the step each log was running then."""
    spans = [_spans(log) for log in logs]
    return [sum(_queued_at(log, span, t) for log, span in zip(logs, spans, strict=True)) for t in moments]


def midpoint(record: Mapping[str, object]) -> float:
    """The wall-clock middle of a logged step."""
    return float(record["end"]) - float(record["seconds"]) / 2  # type: ignore[arg-type]


def _spans(log: Sequence[Mapping[str, object]]) -> tuple[list[float], list[float]]:
    """(ends, starts) of a log's steps, in its order."""
    ends = [float(r["end"]) for r in log]  # type: ignore[arg-type]
    return ends, [end - float(r["seconds"]) for end, r in zip(ends, log, strict=True)]  # type: ignore[arg-type]


def _queued(record: Mapping[str, object]) -> int:
    return int(record["running"]) + int(record["waiting"])  # type: ignore[call-overload]


def _queued_at(log: Sequence[Mapping[str, object]], spans: tuple[list[float], list[float]], t: float) -> int:
    """The queues of log's step running at t; 0 when none was."""
    ends, starts = spans
    k = bisect.bisect_left(ends, t)
    return _queued(log[k]) if k < len(log) and starts[k] <= t else 0


def fit_with_slowdown(samples: Sequence[StepSample], in_flight: Sequence[int]) -> tuple[float, Fit]:
    """The slowdown per request in flight and the step costs fitted with it (module docstring); the
    Fit's residuals are those of the whole model, seconds against costs x (1 + slowdown x requests)."""
    if len(samples) != len(in_flight):
        raise ValueError(f"{len(samples)} steps but {len(in_flight)} counts of requests in flight")
    best: tuple[float, Fit] | None = None
    for slowdown in SLOWDOWN_GRID:
        pairs = zip(samples, in_flight, strict=True)
        scaled = [replace(s, seconds=s.seconds / (1.0 + slowdown * n)) for s, n in pairs]
        fit = fit_step_costs(scaled)
        # The residuals relative to the scaled seconds are those relative to the measured ones: both
        # sides of (predicted - measured) / measured carry the same factor.
        if best is None or fit.rms_relative < best[1].rms_relative:
            best = (slowdown, fit)
    assert best is not None
    return best
