"""Least-squares fit of a model's step-time coefficients (sim/profiles.py's ModelCost) to measured steps.

A step's features are what the simulator's engine charges for (sim/engine_model.py): its batches (each
one's fixed cost), decode rows, the context tokens those rows attend to, prompt tokens computed, and
the (query, key) pairs those chunks attend (the quadratic attention part). The fit minimises the
*relative* error (each row weighted by 1 / its measured time): steps range from 30 ms decodes to 5 s
prefills, and an absolute fit would spend all its freedom on the prefills. A coefficient the data drive
negative (a term the machine does not show, buried in noise) is fixed at 0 and the rest refitted, since a
negative cost would let a large enough step take negative time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TERMS = ("base_s", "per_row_s", "per_context_token_s", "per_prefill_token_s", "per_prefill_attention_s")


@dataclass(frozen=True)
class StepSample:
    """One measured step: decode rows and the context tokens they attend to, prompt tokens computed and
    the (query, key) pairs their chunks attend (attention_work.attended_pairs); seconds as measured.
    batches: the model passes it took (a serving worker's iteration may run an urgent prompt's batch
    beside the ordinary one, each paying the fixed cost)."""

    rows: int
    context: int
    prefill: int
    attention: int
    seconds: float
    batches: int = 1

    def features(self) -> tuple[float, float, float, float, float]:
        return (
            float(self.batches), float(self.rows), float(self.context), float(self.prefill),
            float(self.attention),
        )  # fmt: skip


@dataclass(frozen=True)
class Fit:
    """coefficients: by TERMS name. Residuals are relative, (predicted - measured) / measured, over the
    samples fitted: their RMS, median and largest magnitude."""

    coefficients: dict[str, float]
    samples: int
    rms_relative: float
    median_abs_relative: float
    max_abs_relative: float

    def predict(self, sample: StepSample) -> float:
        return sum(c * f for c, f in zip(self.coefficients.values(), sample.features(), strict=True))

    def summary(self) -> dict[str, object]:
        return {
            "coefficients": self.coefficients,
            "samples": self.samples,
            "rms_relative_residual": self.rms_relative,
            "median_abs_relative_residual": self.median_abs_relative,
            "max_abs_relative_residual": self.max_abs_relative,
        }


def fit_step_costs(samples: Sequence[StepSample], terms: Sequence[str] = TERMS) -> Fit:
    """Nonnegative relative least squares over `terms` (a subset of TERMS, in TERMS order; the others
    are 0). ValueError with fewer samples than terms."""
    index = [TERMS.index(t) for t in terms]
    if len(samples) < len(index):
        raise ValueError(f"{len(samples)} samples cannot fit {len(index)} coefficients")
    x = np.array([s.features() for s in samples])[:, index]
    y = np.array([s.seconds for s in samples])
    weight = 1.0 / y
    active = list(range(len(index)))
    coef = np.zeros(len(index))
    while active:
        solved, *_ = np.linalg.lstsq(x[:, active] * weight[:, None], y * weight, rcond=None)
        if (solved >= 0).all():
            coef[:] = 0.0
            coef[active] = solved
            break
        # Drop the most negative term (an active-set step of nonnegative least squares) and refit.
        active.pop(int(np.argmin(solved)))
    relative = (x @ coef - y) / y
    coefficients = dict.fromkeys(TERMS, 0.0)
    for term, value in zip(terms, coef.tolist(), strict=True):
        coefficients[term] = value
    return Fit(
        coefficients=coefficients,
        samples=len(samples),
        rms_relative=float(np.sqrt(np.mean(relative**2))),
        median_abs_relative=float(np.median(np.abs(relative))),
        max_abs_relative=float(np.max(np.abs(relative))),
    )
