"""The calibration's measurement on the real engine (a tiny checkpoint) and the CPU profile built from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.worker.engine.config import EngineConfig
from services.worker.engine.embedding import EmbeddingEngine
from services.worker.engine.llm_engine import LLMEngine
from sim.calibrate import Grid, measure_decoder, measure_encoder, single_token_words
from sim.cpu_profile import cpu_profile, kv_capacity
from sim.engine_model import GpuEngine
from sim.fit import TERMS, fit_step_costs

SMALL = Grid(
    decode_rows=(1, 3),
    decode_contexts=(32, 96),
    decode_steps=3,
    prefill_chunks=((0, (16, 64)), (64, (16, 32))),
    mixed=((2, 96, 32),),
)


@pytest.fixture(scope="module")
def decoder_steps(llama_gqa_dir: Path) -> list:
    engine = LLMEngine(llama_gqa_dir, EngineConfig(max_num_seqs=4, max_num_batched_tokens=256, policy="fifo"))
    return measure_decoder(engine, engine.model_config.vocab_size, SMALL)


def test_every_kind_of_step_in_the_grid_is_measured_with_its_shape(decoder_steps: list) -> None:
    decodes = [s for s in decoder_steps if s.rows and not s.prefill]
    prompts = {s.prefill for s in decoder_steps if s.prefill and not s.rows}
    mixed = [s for s in decoder_steps if s.rows and s.prefill]
    assert {1, 3} <= {s.rows for s in decodes}  # (and the mixed phase's 2 rows, decoding on alone)
    long_context = [s for s in decodes if s.rows == 1 and s.context > 96]
    assert len(long_context) == SMALL.decode_steps  # a cached 96-token prefix, decoded from
    assert {16, 64, 32} <= prompts  # a chunk over a cached prefix computes only its own tokens
    assert mixed and mixed[0].rows == 2 and mixed[0].prefill == 32
    assert all(s.seconds > 0 for s in decoder_steps)


def test_the_encoder_is_measured_at_its_token_counts(minilm_dir: Path) -> None:
    embedder = EmbeddingEngine(minilm_dir)
    try:
        words = single_token_words(minilm_dir / "tokenizer.json")
        # Each word is one token: 30 words and [CLS] / [SEP] are 32.
        assert len(embedder.tokenizer.encode_batch([" ".join(words[:30])], max_length=512)[0]) == 32
        samples = measure_encoder(embedder, words)
    finally:
        embedder.close()
    assert sorted({s.prefill for s in samples}) == [8, 32, 64, 128, 254]


def _calibration(decoder_steps: list) -> dict:
    fit = fit_step_costs(decoder_steps)
    encoder = {"coefficients": dict.fromkeys(TERMS, 0.0) | {"base_s": 0.005, "per_prefill_token_s": 1e-4}}
    return {
        "worker": {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "kv_capacity_tokens": 65536,
                   "num_layers": 30},
        "models": {
            "smollm2": {**fit.summary(), "weight_bytes": 269_030_016, "kv_bytes_per_token": 23040,
                        "load_s": 7.0},
            "minilm": {**encoder, "weight_bytes": 45_130_752, "kv_bytes_per_token": 0, "load_s": 0.1},
        },
    }  # fmt: skip


def test_the_profile_is_the_worker_as_the_mesh_configures_it(decoder_steps: list) -> None:
    profile = cpu_profile(_calibration(decoder_steps), "smollm2", "minilm")
    assert (profile.max_running, profile.token_budget) == (8, 2048)
    assert kv_capacity(profile, "smollm2") == 65536
    engine = GpuEngine(0, profile, ["smollm2", "minilm"], lambda *a: None, lambda r: None)
    assert engine.kv_capacity == 65536  # the simulated engine holds exactly the worker's KV tokens
    assert profile.models["minilm"].embedding and not profile.models["smollm2"].embedding
    assert profile.thermal is not None and profile.thermal.min_clock_factor == 1.0  # never throttles
    assert profile.preempt_granularity_s > 0


@pytest.mark.parametrize("threads", ["0", "-2"])
def test_calibrate_refuses_fewer_than_one_thread_naming_the_flag(
    threads: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.calibrate import main

    with pytest.raises(SystemExit) as refused:
        main(["--threads", threads])
    assert refused.value.code == 2
    assert f"--threads must be at least 1, got {threads}" in capsys.readouterr().err
