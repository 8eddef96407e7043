"""What a bench/sim_fidelity.py run writes beside its result and reads back: every request on both sides
as JSON rows (the requests file), and the request overhead measured on the calibration trace's requests."""

from __future__ import annotations

from pathlib import Path

from services.common.workload import WorkloadClass
from sim.fidelity import EMBED_MODEL, Served, embeddings_beside_decoders
from sim.profiles import GpuProfile
from sim.request_overhead import logged_overhead_s, modelled_overhead_s
from sim.serving_fit import logs_by_model, read_step_records


def requests_path(result: Path) -> Path:
    """The requests file of the run whose result is result ("real" with each repeat's number, "sim",
    "calibration_real")."""
    return result.with_name(result.stem + "_requests.json")


def row_of(s: Served) -> dict[str, object]:
    """A request as a JSON row (its class by name)."""
    return {**s.__dict__, "workload": s.workload.name.lower()}


def served_of(row: dict[str, object]) -> Served:
    """A row read back; keys Served lacks (a repeat's number) are dropped."""
    fields = {k: v for k, v in row.items() if k in Served.__dataclass_fields__}
    return Served(**{**fields, "workload": WorkloadClass[str(row["workload"]).upper()]})  # type: ignore[arg-type]


def fitted_overhead_s(
    calibration: list[Served],
    profile: GpuProfile,
    logged: Path | None = None,
    started_unix: float | None = None,
) -> tuple[float, str]:
    """The request overhead on the calibration trace (sim/request_overhead.py) and how it was measured:
    "logged", against the encodes in the calibration's step logs under logged, where the run kept them
    and its wall-clock start (started_unix) and enough embeddings line up; else "modelled"."""
    if logged is not None and started_unix is not None:
        encodes = [r for path in logs_by_model(logged).get(EMBED_MODEL, []) for r in read_step_records(path)]
        sent = [
            (started_unix + s.arrival_s, s.ttft_s, s.prompt)
            for s in calibration
            if s.workload == WorkloadClass.EMBEDDING and s.ttft_s is not None
        ]
        measured = logged_overhead_s(sent, encodes)
        if measured is not None:
            return measured, "logged"
    embeddings = embeddings_beside_decoders(calibration)
    encoder, share = profile.model(EMBED_MODEL), profile.encoder_core_share
    return modelled_overhead_s(embeddings, encoder, share, profile.encoder_wait), "modelled"
