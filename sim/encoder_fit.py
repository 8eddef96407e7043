"""A serving worker's encoder, fitted from its step logs: its cost alone and its share of the core while
the same worker's decoder steps.

On the CPU mesh a worker's encoder is a thread beside its decoder's, on the one core the worker gets.
The offline calibration (sim/calibrate.py) times encodes in a process alone; in the mesh an encode that
runs while the decoder idles costs more than that (fidelity run 23's two traces: a fixed 4.5 ms and
93-98 us a token against 2.4 ms and 85 us offline: the serving thread's own hand-offs), and one that runs
while the decoder steps costs about twice as much again (the core halved, the GIL's hand-offs on top;
the share fitted on a trace ranged 0.38-0.61 over runs 23-26). The
simulated engine charges an encode its cost, over GpuProfile.encoder_core_share while the decoder works
(sim/encoder_path.py), and the mesh's slowdown per request in flight on top (sim/host_contention.py). So
the encoder's logged steps are fitted to exactly that: each step is "beside" when the same worker's
decoder was stepping for most of it (the logs show encodes either wholly inside decoder steps or wholly
outside them), the fixed and per-token costs are fitted to the steps alone, and the share is the median of
what that fit predicts for each step beside over what it took.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sim.cpu_profile import HALVED_CORE
from sim.fit import Fit, StepSample, fit_step_costs
from sim.host_contention import in_flight_at, midpoint

ENCODER_TERMS = ("base_s", "per_prefill_token_s")  # an encode has no decode rows, context or KV
BESIDE = 0.5  # a step is beside the decoder when the decoder stepped for more than this share of it
MIN_STEPS_OF_A_KIND = 5  # alone (for the costs) and beside (for the share): fewer fit nothing of theirs


@dataclass(frozen=True)
class EncoderStep:
    """One logged encode: its shape and time, whether the worker's decoder was stepping for most of it,
    and the requests in flight in the mesh at its midpoint."""

    sample: StepSample
    beside: bool
    in_flight: int


@dataclass(frozen=True)
class EncoderFit:
    """The encoder's costs (a Fit over ENCODER_TERMS) and its share of the core beside the decoder (None:
    too few steps of one kind to tell)."""

    fit: Fit
    core_share: float | None


def worker_of(path: Path) -> str:
    """The worker process a step log belongs to: its file's "worker-<pid>" (serving_fit.logs_by_model)."""
    return "-".join(path.stem.split("-", 2)[:2])


def encoder_steps(
    encoder_paths: Sequence[Path],
    decoder_paths: Sequence[Path],
    records: Mapping[Path, Sequence[Mapping[str, object]]],
) -> list[EncoderStep]:
    """Every step of the encoder's logs, told beside or alone by the decoder log of the same worker, with
    the mesh's requests in flight counted from every decoder log."""
    decoders = {worker_of(p): records[p] for p in decoder_paths}
    every_decoder = [records[p] for p in decoder_paths]
    steps = []
    for path in encoder_paths:
        log = records[path]
        busy = decoder_busy_share(log, decoders.get(worker_of(path), ()))
        counts = in_flight_at(every_decoder, [midpoint(r) for r in log])
        for record, share, n in zip(log, busy, counts, strict=True):
            sample = StepSample(
                rows=0, context=0, prefill=int(record["prefill"]), attention=0,  # type: ignore[call-overload]
                seconds=float(record["seconds"]), batches=int(record["batches"]),  # type: ignore[arg-type, call-overload]
            )  # fmt: skip
            steps.append(EncoderStep(sample, share > BESIDE, n))
    return steps


def decoder_busy_share(
    encoder_log: Sequence[Mapping[str, object]], decoder_log: Sequence[Mapping[str, object]]
) -> list[float]:
    """For each encoder step, the share of its time the decoder log's steps overlap (an engine's steps
    follow one another, so the log is in order of start and end alike)."""
    ends = [float(r["end"]) for r in decoder_log]  # type: ignore[arg-type]
    starts = [end - float(r["seconds"]) for end, r in zip(ends, decoder_log, strict=True)]  # type: ignore[arg-type]
    shares = []
    for record in encoder_log:
        end = float(record["end"])  # type: ignore[arg-type]
        seconds = float(record["seconds"])  # type: ignore[arg-type]
        start = end - seconds
        overlap = 0.0
        k = bisect.bisect_right(ends, start)  # the first decoder step ending after this one starts
        while k < len(ends) and starts[k] < end:
            overlap += min(ends[k], end) - max(starts[k], start)
            k += 1
        shares.append(overlap / seconds if seconds > 0 else 0.0)
    return shares


def fit_encoder(
    steps: Sequence[EncoderStep], slowdown: float = 0.0, assumed_share: float = HALVED_CORE
) -> EncoderFit | None:
    """The encoder's costs and core share (module docstring), each step's seconds first divided by the
    mesh's slowdown for its requests in flight (1 + slowdown x in_flight). With fewer than
    MIN_STEPS_OF_A_KIND encodes of one kind the share is not fitted (None): the costs come from the
    encodes alone, or where too few ran alone (a busy trace: 3 of 63 in fidelity run 24's calibration)
    from those beside taken at assumed_share of the core. None with too few of either."""
    alone, beside = [], []
    for step in steps:
        sample = replace(step.sample, seconds=step.sample.seconds / (1 + slowdown * step.in_flight))
        (beside if step.beside else alone).append(sample)
    enough_alone, enough_beside = len(alone) >= MIN_STEPS_OF_A_KIND, len(beside) >= MIN_STEPS_OF_A_KIND
    if not enough_alone:
        if not enough_beside:
            return None
        as_if_alone = [replace(s, seconds=s.seconds * assumed_share) for s in beside]
        return EncoderFit(fit_step_costs(as_if_alone, ENCODER_TERMS), None)
    fit = fit_step_costs(alone, ENCODER_TERMS)
    if not enough_beside:
        return EncoderFit(fit, None)
    # A median, not a least-squares share: encodes are short and their times noisy (30% RMS about any
    # fit), and a joint fit trades the share against the fixed cost (run 23's calibration: 0.64 joint,
    # 0.52 as the median, 0.53 the median on its evaluation trace's steps).
    share = float(np.median([fit.predict(s) / s.seconds for s in beside]))
    return EncoderFit(fit, min(share, 1.0))
