"""The serving calibration: step logs as a worker writes them, cut per replay, fitted per model."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from bench.fidelity_steps import cut_logs, log_sizes, out_of_sample
from services.worker.engine.step_log import StepLog, StepShape
from sim.fit import TERMS
from sim.fleet import NetworkCosts
from sim.profiles import ModelCost
from sim.request_overhead import modelled_overhead_s
from sim.serving_fit import logs_by_model, read_step_log, serving_calibration

SERVING = dict(zip(TERMS, (0.06, 0.002, 8e-6, 2.5e-3, 2e-6), strict=True))  # about twice an offline fit
OFFLINE = dict(zip(TERMS, (0.03, 0.001, 4e-6, 1.2e-3, 1e-6), strict=True))
ENCODER = {"base_s": 0.01, "per_row_s": 0.0, "per_context_token_s": 0.0, "per_prefill_token_s": 3e-4,
           "per_prefill_attention_s": 0.0}  # fmt: skip


def _calibration() -> dict[str, object]:
    """A record shaped as sim/calibrate.py writes it."""
    return {
        "key": "cpu_profile_test",
        "worker": {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "kv_capacity_tokens": 65536,
                   "max_model_len": 8192, "num_layers": 30},
        "models": {
            "chat-model": {"coefficients": dict(OFFLINE), "weight_bytes": 1, "kv_bytes_per_token": 10,
                           "load_s": 1.0},
            "minilm": {"coefficients": dict(ENCODER), "weight_bytes": 1, "kv_bytes_per_token": 0,
                       "load_s": 0.1},
        },
    }  # fmt: skip


def _write_steps(log: StepLog, coefficients: dict[str, float]) -> int:
    """Decode, prompt and mixed iterations (some of two batches) timed exactly by coefficients."""
    shapes = [(1, r, r * c, 0, 0) for r, c in itertools.product((1, 3, 8), (40, 600, 1500))]
    shapes += [(b, 0, 0, n, n * (n + k)) for b, n, k in itertools.product((1, 2), (16, 200, 1024), (0, 900))]
    shapes += [(2, 5, 3000, 128, 128 * 128), (1, 7, 4200, 512, 512 * 700)]
    for batches, rows, context, prefill, attention in shapes:
        features = (batches, rows, context, prefill, attention)
        seconds = sum(coefficients[t] * f for t, f in zip(TERMS, features, strict=True))
        shape = StepShape(batches, rows, context, prefill, attention, execute_s=seconds / 2)
        log.write_step(shape, seconds)
    return len(shapes)


def test_serving_steps_refit_the_decoder_and_keep_the_rest(tmp_path: Path) -> None:
    log = StepLog(tmp_path / "worker-41-chat-model.jsonl")
    _write_steps(log, SERVING)
    log.close()
    offline = _calibration()
    fitted = serving_calibration(offline, logs_by_model(tmp_path), samples_per_term=2)
    chat = fitted["models"]["chat-model"]  # type: ignore[index]
    for term in TERMS:
        assert chat["coefficients"][term] == pytest.approx(SERVING[term], rel=1e-6, abs=1e-12)
    assert chat["weight_bytes"] == 1 and chat["kv_bytes_per_token"] == 10  # sizes as calibrated
    assert fitted["models"]["minilm"]["coefficients"] == ENCODER  # type: ignore[index]
    assert offline["models"]["chat-model"]["coefficients"] == OFFLINE  # type: ignore[index]  (not mutated)
    assert fitted["source"] == "serving" and fitted["serving_fit"]["kept_offline"] == []  # type: ignore[index]


def test_too_few_steps_keep_the_offline_fit(tmp_path: Path) -> None:
    log = StepLog(tmp_path / "worker-41-chat-model.jsonl")
    written = _write_steps(log, SERVING)
    log.close()
    fitted = serving_calibration(_calibration(), logs_by_model(tmp_path), samples_per_term=written)
    assert fitted["models"]["chat-model"]["coefficients"] == OFFLINE  # type: ignore[index]
    assert fitted["serving_fit"]["kept_offline"] == ["chat-model"]  # type: ignore[index]


def test_a_log_of_an_unknown_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "worker-1-other.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"'other'.*chat-model, minilm"):
        serving_calibration(_calibration(), logs_by_model(tmp_path))


def test_file_names_give_the_model_and_a_cut_line_is_skipped(tmp_path: Path) -> None:
    log = StepLog(tmp_path / "worker-7-org_model-v2.jsonl")
    log.write_step(StepShape(1, 2, 80, 0, 0, 0.01), 0.02)
    log.close()
    with (tmp_path / "worker-7-org_model-v2.jsonl").open("a") as f:
        f.write('{"batches": 1, "rows"')  # a worker stopped mid-line
    assert list(logs_by_model(tmp_path)) == ["org_model-v2"]
    [sample] = read_step_log(tmp_path / "worker-7-org_model-v2.jsonl")
    assert (sample.batches, sample.rows, sample.context, sample.seconds) == (1, 2, 80, 0.02)


def test_cut_logs_copy_only_what_a_replay_added(tmp_path: Path) -> None:
    live = tmp_path / "workers"
    log = StepLog(live / "worker-1-chat-model.jsonl")
    log.write_step(StepShape(1, 1, 10, 0, 0, 0.01), 0.01)  # warm-up
    before = log_sizes(live)
    _write_steps(log, SERVING)
    with (live / "worker-1-chat-model.jsonl").open("a") as f:
        f.write('{"batches"')  # the next line, half written when the replay ended
    cut = cut_logs(live, before, tmp_path / "calibration")
    log.close()
    steps = read_step_log(cut / "worker-1-chat-model.jsonl")
    assert len(steps) == _write_steps(StepLog(tmp_path / "count.jsonl"), SERVING)
    assert all(s.context != 10 for s in steps)
    decoder = {"kv_bytes_per_token": 10}
    report = out_of_sample({"models": {"chat-model": {"coefficients": SERVING, **decoder}}}, cut)
    assert report["chat-model"]["median_abs_relative_error"] == pytest.approx(0.0, abs=1e-9)
    report = out_of_sample({"models": {"chat-model": {"coefficients": OFFLINE, **decoder}}}, cut)
    assert report["chat-model"]["measured_over_predicted_p50"] == pytest.approx(2.0, rel=0.25)


def test_the_modelled_overhead_is_what_embeddings_took_beyond_their_encode_as_charged() -> None:
    encoder = ModelCost("minilm", 0.005, 0.0, 0.0, 2e-4, 0.0, 1, 0, 0.1, 0.1, embedding=True)
    # encodes of 5 + 0.2 x tokens ms, seen by the caller 8 ms later (one outlier waited behind others);
    # beside a working decoder at half the core, after a 1 ms wait: twice the encode, then the 8 ms
    alone = [(tokens, 0.005 + 2e-4 * tokens + 0.008, False) for tokens in (10, 40, 90)]
    beside = [(tokens, 0.001 + 2 * (0.005 + 2e-4 * tokens) + 0.008, True) for tokens in (20, 200)]
    seen = [*alone, *beside, (50, 0.5, True)]
    assert modelled_overhead_s(seen, encoder, core_share=0.5, wait_s=0.001) == pytest.approx(0.008)
    # Charged as if alone, the shared encodes would count their second half as overhead.
    assert modelled_overhead_s(seen, encoder, core_share=1.0) > 0.008
    assert modelled_overhead_s([], encoder, 0.5) == 0.0
    # Faster than the fit: not negative.
    assert modelled_overhead_s([(100, 0.001, False)], encoder, 0.5) == 0.0
    network = NetworkCosts(request_overhead_s=0.008)
    assert network.round_trip_s(True) == pytest.approx(NetworkCosts().round_trip_s(True) + 0.008)
    assert network.round_trip_s(False) == pytest.approx(NetworkCosts().round_trip_s(False) + 0.008)


def test_a_resampled_fit_draws_the_same_number_of_steps_with_replacement(tmp_path: Path) -> None:
    log = StepLog(tmp_path / "worker-41-chat-model.jsonl")
    written = _write_steps(log, SERVING)
    log.close()
    logs = logs_by_model(tmp_path)
    fits = [
        serving_calibration(_calibration(), logs, samples_per_term=2, resample=np.random.default_rng(seed))
        for seed in (1, 1, 2)
    ]
    steps = [[tuple(sorted(s.items())) for s in f["models"]["chat-model"]["steps"]] for f in fits]  # type: ignore[index]
    assert all(len(s) == written for s in steps)
    assert steps[0] == steps[1] != steps[2]  # seeded: the same draw again, another seed another
    assert len(set(steps[2])) < written  # with replacement: some steps twice, some not at all
