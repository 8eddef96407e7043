"""The step logs of bench/sim_fidelity.py's mesh, cut per replay, and how well a fit predicts them.

The mesh's workers append to their step logs for as long as they run (warm-up, the calibration trace, the
evaluation trace); the bench notes each file's size between replays and copies out the bytes each replay
added, so a fit sees only its own trace's steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sim.cpu_profile import encoder_core_share
from sim.encoder_fit import encoder_steps
from sim.fit import TERMS
from sim.host_contention import in_flight_at, in_flight_per_step, midpoint
from sim.serving_fit import is_encoder, logs_by_model, read_step_records, sample_of


def steps_dir(out: Path) -> Path:
    """Where a run whose result is out keeps its step logs (calibration/ and evaluation/, one file a
    worker process and model)."""
    return out.with_name(out.stem + "_steps")


def log_sizes(directory: Path) -> dict[str, int]:
    """Each step log's size in bytes now (by file name)."""
    return {p.name: p.stat().st_size for p in directory.glob("*.jsonl")}


def cut_logs(directory: Path, since: Mapping[str, int], out: Path) -> Path:
    """What each log under directory gained since the sizes in since (whole lines), copied under out."""
    out.mkdir(parents=True, exist_ok=True)
    for path in directory.glob("*.jsonl"):
        data = path.read_bytes()[since.get(path.name, 0) :]
        (out / path.name).write_bytes(data[: data.rfind(b"\n") + 1])
    return out


def out_of_sample(fitted: Mapping[str, object], directory: Path) -> dict[str, dict[str, float | int]]:
    """Per model logged under directory: how a calibration record's coefficients (its slowdown per
    request in flight, sim/host_contention.py, and an encoder's share of the core beside its worker's
    decoder, sim/encoder_fit.py) predict those steps (steps, median and RMS relative error, and the
    median of measured / predicted)."""
    models = fitted["models"]
    assert isinstance(models, Mapping)
    logs = {name: paths for name, paths in logs_by_model(directory).items() if name in models}
    records = {path: read_step_records(path) for paths in logs.values() for path in paths}
    decoders = [p for name, paths in logs.items() if not is_encoder(models[name]) for p in paths]
    in_flight = dict(zip(decoders, in_flight_per_step([records[p] for p in decoders]), strict=True))
    report: dict[str, dict[str, float | int]] = {}
    for name, paths in logs.items():
        rows = [r for p in paths for r in records[p]]
        if not rows:
            continue
        record = models[name]
        share = np.ones(len(rows))
        if is_encoder(record):
            # An encode beside its worker's decoder runs at the fitted share of the core (encoder_fit.py).
            beside = [s.beside for s in encoder_steps(paths, decoders, records)]
            share[beside] = encoder_core_share(record)
            counts = np.array(in_flight_at([records[p] for p in decoders], [midpoint(r) for r in rows]))
        else:
            counts = np.array([n for p in paths for n in in_flight[p]])
        c = np.array([float(record["coefficients"][t]) for t in TERMS])
        slowdown = float(record.get("host_slowdown_per_request", 0.0))
        features = np.array([sample_of(r).features() for r in rows])
        predicted = features @ c * (1.0 + slowdown * counts) / share
        measured = np.array([float(r["seconds"]) for r in rows])
        relative = (predicted - measured) / measured
        report[name] = {
            "steps": len(rows),
            "median_abs_relative_error": float(np.median(np.abs(relative))),
            "rms_relative_error": float(np.sqrt(np.mean(relative**2))),
            "measured_over_predicted_p50": float(np.median(measured / predicted)),
        }
    return report
