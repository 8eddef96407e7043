"""The step-time fit recovers the coefficients that generated step times."""

from __future__ import annotations

import itertools

import pytest

from sim.fit import TERMS, StepSample, fit_step_costs


def _grid(coefficients: dict[str, float]) -> list[StepSample]:
    """Decode-only, prompt-only and mixed steps timed exactly by the linear model."""
    shapes = [(rows, rows * ctx, 0, 0) for rows, ctx in itertools.product((1, 2, 4, 8), (32, 512, 1536))]
    chunks = itertools.product((16, 128, 512, 2048), (0, 1024))
    shapes += [(0, 0, chunk, chunk * (cached + chunk)) for chunk, cached in chunks]
    shapes += [(4, 2048, 128, 128 * 128), (7, 3584, 512, 512 * 512)]
    samples = []
    for rows, context, prefill, attention in shapes:
        features = (1.0, rows, context, prefill, attention)
        seconds = sum(coefficients[t] * f for t, f in zip(TERMS, features, strict=True))
        samples.append(StepSample(rows, context, prefill, attention, seconds))
    return samples


CPU_LIKE = dict(zip(TERMS, (0.03, 0.0008, 4e-6, 1.2e-3, 1e-6), strict=True))


@pytest.mark.parametrize(
    "coefficients",
    [
        CPU_LIKE,
        {**CPU_LIKE, "per_row_s": 0.0},  # a term the machine does not show
        dict(zip(TERMS, (0.004, 1e-5, 5e-8, 2e-5, 2e-10), strict=True)),  # GPU-like magnitudes
    ],
)
def test_the_fit_recovers_known_coefficients(coefficients: dict[str, float]) -> None:
    fit = fit_step_costs(_grid(coefficients))
    for term in TERMS:
        assert fit.coefficients[term] == pytest.approx(coefficients[term], rel=1e-6, abs=1e-12)
    assert fit.max_abs_relative < 1e-9


def test_a_term_driven_negative_is_fixed_at_zero_and_the_rest_refitted() -> None:
    # Decode steps that get cheaper with more rows: the data ask for a negative per-row cost.
    samples = [StepSample(rows, rows * 100, 0, 0, 0.05 - 0.001 * rows) for rows in (1, 2, 4, 8)]
    samples += [StepSample(0, 0, n, n * n, 0.05 + 0.001 * n) for n in (16, 64, 256)]
    fit = fit_step_costs(samples)
    assert all(value >= 0.0 for value in fit.coefficients.values())
    assert fit.coefficients["per_row_s"] == 0.0


def test_a_subset_of_terms_leaves_the_others_zero() -> None:
    samples = [StepSample(0, 0, n, 0, 0.006 + 1.5e-4 * n) for n in (8, 32, 128, 254)]
    fit = fit_step_costs(samples, ("base_s", "per_prefill_token_s"))
    assert fit.coefficients["base_s"] == pytest.approx(0.006)
    assert fit.coefficients["per_prefill_token_s"] == pytest.approx(1.5e-4)
    assert fit.coefficients["per_row_s"] == fit.coefficients["per_prefill_attention_s"] == 0.0


def test_too_few_samples_for_the_terms_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot fit"):
        fit_step_costs([StepSample(1, 10, 0, 0, 0.03)])
