"""What a bench/sim_fidelity.py run writes beside its result and reads back: every request on both sides
as JSON rows (the requests file), and the request overhead fitted to the calibration trace's requests."""

from __future__ import annotations

from pathlib import Path

from services.common.workload import WorkloadClass
from sim.fidelity import EMBED_MODEL, Served, embeddings_beside_decoders
from sim.profiles import GpuProfile
from sim.serving_fit import request_overhead_s


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


def fitted_overhead_s(calibration: list[Served], profile: GpuProfile) -> float:
    """The request overhead fitted to the calibration trace's embeddings (serving_fit.request_overhead_s)."""
    embeddings = embeddings_beside_decoders(calibration)
    return request_overhead_s(
        embeddings, profile.model(EMBED_MODEL), profile.encoder_core_share, profile.encoder_wait
    )
