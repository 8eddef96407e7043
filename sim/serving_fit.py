"""Step-time coefficients fitted to the steps a serving worker logged (services/worker/engine/step_log.py).

sim/calibrate.py times LLMEngine.step() alone in a process of its own. In the local mesh the same steps
run beside the worker's gRPC server, its token streams, the other worker, the gateway, the placer, Redis
and the client, all on two cores, and each iteration also hands its outputs over and takes the next
commands: on this VM that made a worker's time per output token about twice the fitted one. A worker
started with HANZO_WORKER_STEP_LOG_DIR records every iteration as it served; fitting the same terms to
those records gives the simulator the step times of a worker under that load. To keep the fit honest,
the records come from a calibration trace of their own (another seed), never from the trace the
simulator is then compared on.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from sim.encoder_fit import ENCODER_TERMS, encoder_steps, fit_encoder
from sim.fit import TERMS, StepSample, fit_step_costs
from sim.host_contention import fit_with_slowdown, in_flight_per_step


def read_step_records(path: Path) -> list[dict[str, object]]:
    """The records of a step log, a dict per line (lines cut short by a stopping worker are skipped)."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def sample_of(record: Mapping[str, object]) -> StepSample:
    """A step-log record's shape and time."""
    return StepSample(
        rows=int(record["rows"]), context=int(record["context"]), prefill=int(record["prefill"]),  # type: ignore[call-overload]
        attention=int(record["attention"]), seconds=float(record["seconds"]),  # type: ignore[call-overload, arg-type]
        batches=int(record["batches"]),  # type: ignore[call-overload]
    )  # fmt: skip


def read_step_log(path: Path) -> list[StepSample]:
    """One StepSample per record of a step log."""
    return [sample_of(record) for record in read_step_records(path)]


def logs_by_model(directory: Path) -> dict[str, list[Path]]:
    """The step logs under directory by model name (files are <process>-<model>.jsonl, the process
    "worker-<pid>")."""
    found: dict[str, list[Path]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        parts = path.stem.split("-", 2)  # worker, pid, model (whose name may hold "-")
        found.setdefault(parts[2] if len(parts) == 3 else path.stem, []).append(path)
    return found


def is_encoder(record: Mapping[str, object]) -> bool:
    """A calibrated model record (sim/calibrate.py's) of an encoder: one that keeps no KV."""
    return int(record["kv_bytes_per_token"]) == 0  # type: ignore[call-overload]


def serving_calibration(
    offline: Mapping[str, object],
    logs: Mapping[str, Iterable[Path]],
    samples_per_term: int = 10,
    resample: np.random.Generator | None = None,
    slowdown: bool = True,
) -> dict[str, object]:
    """offline (sim/calibrate.py's record) with each logged decoder's coefficients and residuals refitted
    to its serving steps, with the mesh's slowdown per request in flight (sim/host_contention.py;
    "host_slowdown_per_request" in the model's record, 0 with slowdown False); the rest (sizes, worker
    configuration) as calibrated. A decoder with fewer than samples_per_term logged steps per fitted term
    keeps its offline fit (named under "kept_offline"). An encoder is refitted with its share of the core
    beside its worker's decoder ("encoder_core_share" in its record, sim/encoder_fit.py), its steps
    slowed by the decoders' slowdown per request in flight; it keeps its offline fit with fewer than
    samples_per_term steps per fitted term, or too few of both kinds (encoder_fit.fit_encoder).
    ValueError when a logged model is not in offline. resample: fit a bootstrap resample of each model's
    steps instead (as many, drawn with replacement), for the spread of the fit."""
    result = copy.deepcopy(dict(offline))
    models = result["models"]
    assert isinstance(models, dict)
    paths_of = {name: list(paths) for name, paths in logs.items()}
    for name in paths_of:
        if name not in models:
            known = ", ".join(sorted(models))
            raise ValueError(f"step logs for {name!r}, which the calibration does not know ({known})")
    records = {path: read_step_records(path) for paths in paths_of.values() for path in paths}
    decoder_paths = [p for name, paths in paths_of.items() if not is_encoder(models[name]) for p in paths]
    in_flight = dict(zip(decoder_paths, in_flight_per_step([records[p] for p in decoder_paths]), strict=True))
    refitted, kept = {}, []
    # Decoders first: an encoder's steps are fitted under the slowdown the decoders' show.
    for name, paths in sorted(paths_of.items(), key=lambda item: is_encoder(models[item[0]])):
        record = models[name]
        if is_encoder(record):
            slowed = max((float(r["host_slowdown_per_request"]) for r in refitted.values()), default=0.0)
            encoded = _refit_encoder(paths, decoder_paths, records, samples_per_term, resample, slowed)
            if encoded is None:
                kept.append(name)
                continue
            record.update(encoded)
            refitted[name] = {k: v for k, v in encoded.items() if k != "steps"}
            continue
        steps = [
            (sample_of(r), n) for path in paths for r, n in zip(records[path], in_flight[path], strict=True)
        ]
        if resample is not None and steps:
            steps = [steps[i] for i in resample.integers(len(steps), size=len(steps))]
        if len(steps) < samples_per_term * len(TERMS):
            kept.append(name)
            continue
        samples = [s for s, _ in steps]
        if slowdown:
            per_request, fit = fit_with_slowdown(samples, [n for _, n in steps])
        else:
            per_request, fit = 0.0, fit_step_costs(samples)
        record.update(fit.summary(), host_slowdown_per_request=per_request)
        record["steps"] = [s.__dict__ for s in samples]
        refitted[name] = {**fit.summary(), "host_slowdown_per_request": per_request}
    result["source"] = "serving"
    result["serving_fit"] = {"refitted": refitted, "kept_offline": kept}
    return result


def _refit_encoder(
    paths: list[Path],
    decoder_paths: list[Path],
    records: Mapping[Path, list[dict[str, object]]],
    samples_per_term: int,
    resample: np.random.Generator | None,
    slowdown: float,
) -> dict[str, object] | None:
    """An encoder's record update from its serving steps (sim/encoder_fit.py), None to keep the offline
    fit. Its core share stays out of the record when too few steps ran beside the decoder to tell it."""
    steps = encoder_steps(paths, decoder_paths, records)
    if resample is not None and steps:
        steps = [steps[i] for i in resample.integers(len(steps), size=len(steps))]
    if len(steps) < samples_per_term * len(ENCODER_TERMS):
        return None
    fitted = fit_encoder(steps, slowdown)
    if fitted is None:
        return None
    update: dict[str, object] = {**fitted.fit.summary(), "host_slowdown_per_request": slowdown}
    if fitted.core_share is not None:
        update["encoder_core_share"] = fitted.core_share
    update["steps"] = [s.sample.__dict__ for s in steps]
    return update
