"""The encoder's serving fit (sim/encoder_fit.py): its costs from encodes run alone and its share of the
core from those run beside its worker's decoder; and the request overhead measured against each
embedding's own logged encode (sim/request_overhead.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from bench.fidelity_records import fitted_overhead_s
from bench.fidelity_steps import out_of_sample
from services.common.workload import WorkloadClass
from services.worker.engine.step_log import StepLog
from sim.cpu_profile import cpu_profile
from sim.encoder_fit import MIN_STEPS_OF_A_KIND, EncoderStep, decoder_busy_share, fit_encoder
from sim.fidelity import EMBED_MODEL, Served
from sim.fit import StepSample
from sim.request_overhead import MIN_MATCHED, logged_overhead_s
from sim.serving_fit import logs_by_model, serving_calibration
from tests.sim.test_serving_fit import _calibration

BASE_S, PER_TOKEN_S = 0.004, 1e-4  # an encode alone
SHARE = 0.5  # of the core, beside a stepping decoder
TOKENS = (8, 32, 64, 128, 254)


def _alone_s(tokens: int) -> float:
    return BASE_S + PER_TOKEN_S * tokens


def _encode(end: float, tokens: int, seconds: float, inputs: int = 1) -> dict[str, object]:
    return {"batches": 1, "rows": 0, "context": 0, "prefill": tokens, "attention": 0, "inputs": inputs,
            "seconds": seconds, "execute_s": seconds, "end": end}  # fmt: skip


def _decode(end: float, seconds: float, running: int = 0) -> dict[str, object]:
    return {"batches": 1, "rows": 0, "context": 0, "prefill": 0, "attention": 0, "seconds": seconds,
            "running": running, "waiting": 0, "end": end}  # fmt: skip


def test_an_encode_is_beside_the_decoder_for_the_share_of_it_decoder_steps_overlap() -> None:
    decoder = [_decode(1.0, 1.0), _decode(3.0, 1.0)]  # steps over [0, 1] and [2, 3]
    encodes = [
        _encode(0.6, 10, 0.2),  # [0.4, 0.6]: inside the first step
        _encode(1.5, 10, 0.2),  # [1.3, 1.5]: between the steps
        _encode(2.1, 10, 0.2),  # [1.9, 2.1]: half in the second
        _encode(2.5, 10, 2.0),  # [0.5, 2.5]: half of each step, 1 s of its 2
    ]
    assert decoder_busy_share(encodes, decoder) == pytest.approx([1.0, 0.0, 0.5, 0.5])
    assert decoder_busy_share(encodes, []) == [0.0] * 4


def _steps(slowdown: float) -> list[EncoderStep]:
    """Encodes alone and beside, with 0 or 6 requests in flight, timed exactly by the model."""
    return [
        EncoderStep(
            StepSample(0, 0, tokens, 0, _alone_s(tokens) * (1 + slowdown * n) / (SHARE if beside else 1.0)),
            beside,
            n,
        )
        for tokens, beside, n in itertools.product(TOKENS, (False, True), (0, 6))
    ]


def test_the_fit_takes_the_costs_from_encodes_alone_and_the_share_from_those_beside() -> None:
    fitted = fit_encoder(_steps(0.01), slowdown=0.01)
    assert fitted is not None
    assert fitted.fit.coefficients["base_s"] == pytest.approx(BASE_S)
    assert fitted.fit.coefficients["per_prefill_token_s"] == pytest.approx(PER_TOKEN_S)
    assert fitted.core_share == pytest.approx(SHARE)
    # Read without the mesh's slowdown, the costs take it in: the fit is not blind to it.
    unslowed = fit_encoder(_steps(0.01))
    assert unslowed is not None and unslowed.fit.coefficients["base_s"] > BASE_S
    # No encodes alone (a busy trace): the costs from those beside, at the share assumed.
    busy = fit_encoder([s for s in _steps(0.0) if s.beside], assumed_share=SHARE)
    assert busy is not None and busy.core_share is None
    assert busy.fit.coefficients["base_s"] == pytest.approx(BASE_S)
    assert fit_encoder([s for s in _steps(0.0) if s.beside][: MIN_STEPS_OF_A_KIND - 1]) is None
    # None beside: the costs, and no share to tell.
    alone = fit_encoder([s for s in _steps(0.0) if not s.beside])
    assert alone is not None and alone.core_share is None
    assert alone.fit.coefficients["per_prefill_token_s"] == pytest.approx(PER_TOKEN_S)


def test_the_serving_calibration_refits_the_encoder_from_each_workers_logs(tmp_path: Path) -> None:
    """Two workers, each a decoder stepping over [k, k + 0.5) of every second and an encoder whose
    encodes run inside those steps (at half the core) or after them (alone)."""
    for worker, shift in ((1, 0.0), (2, 0.25)):
        decoder = StepLog(tmp_path / f"worker-{worker}-chat-model.jsonl")
        encoder = StepLog(tmp_path / f"worker-{worker}-minilm.jsonl")
        for k, (tokens, beside) in enumerate(itertools.product(TOKENS * 2, (True, False))):
            t = 2.0 * k + shift
            decoder.write(_decode(t + 0.5, 0.5))
            seconds = _alone_s(tokens) / (SHARE if beside else 1.0)
            start = t + 0.1 if beside else t + 0.7
            encoder.write(_encode(start + seconds, tokens, seconds))
        decoder.close()
        encoder.close()
    fitted = serving_calibration(_calibration(), logs_by_model(tmp_path), samples_per_term=2)
    minilm = fitted["models"]["minilm"]  # type: ignore[index]
    assert minilm["coefficients"]["base_s"] == pytest.approx(BASE_S)
    assert minilm["coefficients"]["per_prefill_token_s"] == pytest.approx(PER_TOKEN_S)
    assert minilm["encoder_core_share"] == pytest.approx(SHARE)
    assert fitted["serving_fit"]["kept_offline"] == []  # type: ignore[index]
    assert cpu_profile(fitted, "chat-model", "minilm").encoder_core_share == pytest.approx(SHARE)
    # The out-of-sample check charges the encodes as the simulated engine does: exactly.
    assert out_of_sample(fitted, tmp_path)["minilm"]["rms_relative_error"] == pytest.approx(0.0, abs=1e-9)
    # An offline calibration (encodes timed alone) keeps the halved core.
    assert cpu_profile(_calibration(), "chat-model", "minilm").encoder_core_share == 0.5
    # Too few encodes: the offline fit stays, and says so.
    few = serving_calibration(_calibration(), logs_by_model(tmp_path), samples_per_term=100)
    assert few["serving_fit"]["kept_offline"] == ["chat-model", "minilm"]  # type: ignore[index]
    assert "encoder_core_share" not in few["models"]["minilm"]  # type: ignore[index]


OVERHEAD_S = 0.004


def _embedded(
    sent: float, tokens: int, encode_s: float
) -> tuple[tuple[float, float, int], dict[str, object]]:
    """An embedding sent at sent whose encode of encode_s started 1 ms later, answered OVERHEAD_S after
    sending plus its encode; (as logged_overhead_s reads it, its encoder step-log record)."""
    return (sent, encode_s + OVERHEAD_S, tokens), _encode(sent + 0.001 + encode_s, tokens, encode_s)


def test_the_logged_overhead_is_each_embeddings_time_beyond_its_own_encode() -> None:
    pairs = [_embedded(100.0 + k, tokens, _alone_s(tokens) * (1 + k % 3)) for k, tokens in enumerate(TOKENS)]
    embeddings = [e for e, _ in pairs]
    encodes = [r for _, r in pairs]
    assert logged_overhead_s(embeddings, encodes) == pytest.approx(OVERHEAD_S)
    # An embedding whose window holds two encodes of its length, or only a batch of several inputs,
    # is left out rather than guessed at.
    (twin, twin_encode), (_, other) = _embedded(200.0, 8, 0.01), _embedded(200.0, 8, 0.002)
    batched, batched_encode = _embedded(300.0, 16, 0.01)
    batched_encode["inputs"] = 2
    slow = [
        (sent, seconds + 1.0, tokens) for sent, seconds, tokens in (twin, batched)
    ]  # would move the median
    assert logged_overhead_s([*embeddings, *slow], [*encodes, twin_encode, other, batched_encode]) == (
        pytest.approx(OVERHEAD_S)
    )
    assert logged_overhead_s(embeddings[: MIN_MATCHED - 1], encodes) is None
    # Answered (within the clocks' slack) before its encode ended: never below 0.
    early = [(sent, (seconds - OVERHEAD_S) / 2, tokens) for sent, seconds, tokens in embeddings]
    assert logged_overhead_s(early, encodes) == 0.0


def test_the_bench_measures_the_overhead_on_the_logs_where_it_kept_them(tmp_path: Path) -> None:
    started = 1_000.0
    log = StepLog(tmp_path / f"worker-3-{EMBED_MODEL}.jsonl")
    served = []
    for k, tokens in enumerate(TOKENS * 2):
        (sent, seconds, _), record = _embedded(started + k, tokens, 2 * _alone_s(tokens))
        log.write(record)
        served.append(Served(WorkloadClass.EMBEDDING, k, 0, sent - started, seconds, seconds, tokens, 0))
    log.close()
    profile = cpu_profile(_calibration() | {"models": {**_calibration()["models"], EMBED_MODEL: {  # type: ignore[dict-item]
        "coefficients": {"base_s": BASE_S, "per_row_s": 0.0, "per_context_token_s": 0.0,
                         "per_prefill_token_s": PER_TOKEN_S, "per_prefill_attention_s": 0.0},
        "weight_bytes": 1, "kv_bytes_per_token": 0, "load_s": 0.1}}}, "chat-model", EMBED_MODEL)  # fmt: skip
    assert fitted_overhead_s(served, profile, tmp_path, started) == (pytest.approx(OVERHEAD_S), "logged")
    # Without the run's start (a run from before it was recorded), the encodes are as modelled: these
    # took twice their modelled time, and the modelled overhead takes the difference in.
    overhead, how = fitted_overhead_s(served, profile)
    assert how == "modelled" and overhead > OVERHEAD_S
