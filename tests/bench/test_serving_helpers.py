"""The pure parts of bench/serving.py: ShareGPT decoding and sampling, arrivals, the per-load summary,
and what is read from the servers' start-up output. No server, no model."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest
import tokenizers

from bench.serving import RatePlan, Samples, parse_args
from bench.serving_client import RequestRecord, RunResult, arrival_offsets
from bench.serving_data import ChatTemplater, first_exchange, iter_conversations, sample_requests
from bench.serving_servers import access_lines, vllm_log_facts
from bench.serving_stats import comparisons, run_summary, tpot_s

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def conversation(i: int, human: str, gpt: str) -> dict[str, object]:
    return {
        "id": f"c{i}",
        "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}],
    }


def test_iter_conversations_stops_at_a_truncated_tail() -> None:
    whole = [conversation(0, "a", "b"), conversation(1, "c", "d")]
    text = json.dumps(whole, indent=2) + "\n"
    cut = text[:-1].rstrip("]\n ") + ',\n  {"id": "c2", "conversations": [{"from": "hu'
    assert [c["id"] for c in iter_conversations(cut)] == ["c0", "c1"]
    assert [c["id"] for c in iter_conversations(text)] == ["c0", "c1"]  # a whole file reads the same


def test_first_exchange_takes_the_first_human_turn_and_the_reply_after_it() -> None:
    turns = [
        {"from": "gpt", "value": "hello"},
        {"from": "human", "value": "q"},
        {"from": "gpt", "value": "a"},
    ]
    assert first_exchange({"conversations": turns}) == ("q", "a")
    assert first_exchange({"conversations": [{"from": "human", "value": "q"}]}) is None
    two_humans = [{"from": "human", "value": "q"}, {"from": "human", "value": "r"}]
    assert first_exchange({"conversations": two_humans}) is None


@pytest.fixture
def word_model(tmp_path: Path) -> Path:
    """A checkpoint directory with just a whitespace word-level tokenizer and a ChatML template."""
    words = ["<|im_start|>", "<|im_end|>", "[UNK]", "user", "assistant", "\n"] + [f"w{i}" for i in range(50)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, "[UNK]"))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return tmp_path


def test_templated_prompt_counts_the_template_tokens(word_model: Path) -> None:
    templater = ChatTemplater(word_model)
    # <|im_start|> user w1 w2 <|im_end|> <|im_start|> assistant
    assert templater.prompt_tokens([{"role": "user", "content": "w1 w2"}]) == 7
    assert templater.text_tokens("w1 w2 w3") == 3


def test_sample_requests_filters_caps_and_is_seeded(word_model: Path, tmp_path: Path) -> None:
    rows = [conversation(i, " ".join(["w1"] * (4 + i)), " ".join(["w2"] * (3 + 2 * i))) for i in range(20)]
    path = tmp_path / "data.json"
    path.write_text(json.dumps(rows)[:-1] + ', {"id": "cut')  # truncated like the packaged file
    got = sample_requests(word_model, 8, seed=3, max_output_tokens=20, max_prompt_tokens=20, path=path)
    assert len(got) == 8 and [r.index for r in got] == list(range(8))
    assert all(4 <= r.max_tokens <= 20 and r.prompt_tokens <= 20 for r in got)
    assert "c0" not in {r.conversation_id for r in got}  # a 3-token reply is under the minimum

    again = sample_requests(word_model, 8, seed=3, max_output_tokens=20, max_prompt_tokens=20, path=path)
    assert got == again
    with pytest.raises(SystemExit):
        sample_requests(word_model, 30, seed=3, path=path)


def test_every_load_gets_prompts_no_other_load_sent(word_model: Path, tmp_path: Path) -> None:
    rows = [conversation(i, " ".join(["w1"] * (4 + i % 5)), " ".join(["w2"] * 6)) for i in range(60)]
    path = tmp_path / "data.json"
    path.write_text(json.dumps(rows))
    args = parse_args(["--num-prompts", "5", "--rates", "0.2", "--rate-fractions", "0.5"])
    samples = Samples.draw(word_model, args, path)
    loads = [samples.warm, samples.saturation, *samples.poisson, samples.spare]
    assert [len(x) for x in loads] == [2, 5, 5, 5, 5, 5]  # rates 0.2 and 0.5 x capacity, maybe a moderate
    ids = [r.conversation_id for load in loads for r in load]
    assert len(set(ids)) == len(ids)
    assert samples.at_rate([0.9, 0.2], 0.9) is samples.poisson[1]


def test_arrivals_are_poisson_at_the_rate_and_inf_is_at_once() -> None:
    offsets = arrival_offsets(4000, 2.0, seed=1)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert offsets[0] == 0.0 and statistics.mean(gaps) == pytest.approx(0.5, rel=0.1)
    assert offsets == arrival_offsets(4000, 2.0, seed=1)
    assert arrival_offsets(3, float("inf"), seed=1) == [0.0, 0.0, 0.0]


def record(index: int, chunks: list[float], tokens: int, max_tokens: int = 4) -> RequestRecord:
    rec = RequestRecord(index, max_tokens, started=10.0, chunk_times=chunks, output_tokens=tokens)
    rec.ended = chunks[-1] if chunks else None
    rec.prompt_tokens = 7
    return rec


def test_run_summary_counts_errors_wrong_lengths_and_latencies() -> None:
    good = record(0, [10.1, 10.2, 10.3, 10.4], tokens=4)
    short = record(1, [10.2, 10.4], tokens=2)
    failed = RequestRecord(2, 4, error="UNAVAILABLE: gone")
    result = RunResult(
        float("inf"), duration_s=0.5, records=[good, short, failed], timed_out=False, client_cpu_s=0
    )
    requests = [type("R", (), {"index": i, "prompt_tokens": 7})() for i in range(3)]
    summary = run_summary(result, requests)  # type: ignore[arg-type]
    assert summary["completed"] == 2 and summary["errors"] == 1
    assert summary["error_kinds"] == {"UNAVAILABLE: gone": 1}
    assert summary["wrong_token_counts"] == 1 and summary["prompt_token_mismatches"] == 0
    assert summary["out_tok_s"] == pytest.approx(12.0)
    assert summary["ttft_ms_p50"] == pytest.approx(150.0)
    assert tpot_s(good) == pytest.approx(0.1)
    assert summary["itl_ms_p50"] == pytest.approx(100.0)


def test_comparisons_are_mesh_over_vllm_and_grpc_over_http() -> None:
    report = {"mesh_out_tok_s": 30.0, "vllm_out_tok_s": 20.0, "mesh_ttft_ms_p99": 50.0}
    report |= {"vllm_ttft_ms_p99": 200.0, "grpc_out_tok_s": 29.0}
    assert comparisons(report) == {"out_tok_s_vs_vllm": 1.5, "ttft_p99_vs_vllm": 0.25, "grpc_vs_http": 0.967}
    assert comparisons({"mesh_out_tok_s": 1.0})["out_tok_s_vs_vllm"] is None


def test_rate_plan_is_settled_by_the_first_server() -> None:
    plan = RatePlan(absolute=[0.25], fractions=[0.5, 0.9], fixed_moderate=None)
    assert plan.after_saturation({"inf": {"requests_s": 3.0}}) == [0.25, 1.5, 2.7]
    assert plan.moderate == 1.5 and plan.moderate_key == "1.5"
    # the second server's own capacity changes nothing: both take the same loads
    assert plan.after_saturation({"inf": {"requests_s": 9.0}}) == [0.25, 1.5, 2.7]
    fixed = RatePlan(absolute=[], fractions=[], fixed_moderate=0.7)
    assert fixed.after_saturation({"inf": {"requests_s": None}}) == [0.7] and fixed.capacity is None


def test_start_up_output_is_read() -> None:
    serve = (
        "gateway: 127.0.0.1:5005  (metadata authorization: Bearer k1)\n"
        "openai: http://127.0.0.1:8000/v1  (Authorization: Bearer k1)\napi key: k1\n"
    )
    assert access_lines(serve) == {
        "gateway": "127.0.0.1:5005",
        "openai": "http://127.0.0.1:8000/v1",
        "api key": "k1",
    }
    vllm = "local_rank=0, core ids=[0]\n\treserved_cpus=[1]\nCPU KV cache size: 46,592 tokens, Max"
    assert vllm_log_facts(vllm) == {"compute_cpus": [0], "reserved_cpus": [1], "kv_cache_tokens": 46592}
