"""The demo's report: percentiles, per-class stats, the samples of real answers and the probe, as JSON and
as the printed table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.common.workload import WorkloadClass
from services.mesh.driver import OK, WRONG_ANSWER, RequestResult
from services.mesh.report import build_report, format_report, percentile, write_report
from services.mesh.workload import PROBE_QUESTION


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([5.0], 99, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([4.0, 1.0, 3.0, 2.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        (list(map(float, range(1, 101))), 99, 99.01),
    ],
)
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    got = percentile(values, q)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_percentile_rejects_out_of_range_q() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def _results() -> list[RequestResult]:
    chat, emb = WorkloadClass.REALTIME_CHAT, WorkloadClass.EMBEDDING
    return [
        RequestResult(0, chat, OK, 0.5, 0.1, 20, "w1", chat, 0.0, asked="Why?", text="Because."),
        RequestResult(1, chat, OK, 0.7, 0.2, 30, "w2", chat, 0.5, asked="How?", text=" Like\n this. " * 40),
        RequestResult(2, chat, "UNAVAILABLE", 0.1, sent_at_s=1.0, message="no worker", asked="When?"),
        RequestResult(3, emb, OK, 0.05, node_id="w1", sent_at_s=0.2, asked="A sentence."),
    ]


def test_report_json_shape(tmp_path: Path) -> None:
    report = build_report(_results(), {"seed": 1})
    assert set(report) == {"meta", "classes", "total", "samples", "probe", "ok"}
    assert list(report["classes"]) == ["realtime_chat", "agent_tool", "batch", "embedding"]
    chat = report["classes"]["realtime_chat"]
    assert chat["requests"] == 3 and chat["ok"] == 2
    assert chat["errors"] == {"UNAVAILABLE": 1}
    assert chat["ttft_ms"] == {"p50": 150.0, "p99": pytest.approx(199.0)}
    assert chat["e2e_ms"]["p50"] == 600.0
    assert chat["output_tokens"] == 50
    assert chat["output_tokens_per_s"] == pytest.approx(50 / 1.2, abs=0.1)  # first send 0.0, last end 1.2
    assert chat["nodes"] == {"w1": 1, "w2": 1}
    assert chat["classified_as"] == {"realtime_chat": 2}
    emb = report["classes"]["embedding"]
    assert emb["ttft_ms"] == {"p50": None, "p99": None} and emb["output_tokens_per_s"] is None
    assert report["classes"]["batch"]["requests"] == 0
    assert report["total"]["requests"] == 4 and report["ok"] is False
    path = write_report(report, tmp_path / "sub" / "r.json")
    assert json.loads(path.read_text()) == report
    table = format_report(report)
    assert "realtime_chat" in table and "UNAVAILABLE=1" in table and "w1:1 w2:1" in table
    assert "no worker" in table
    # Samples: answered requests only, whitespace collapsed and trimmed; embeddings have none.
    assert list(report["samples"]) == ["realtime_chat", "agent_tool", "batch"]
    first, second = report["samples"]["realtime_chat"]
    assert first == {"index": 0, "node": "w1", "asked": "Why?", "answer": "Because."}
    assert len(second["answer"]) <= 200 and second["answer"].startswith("Like this. Like")
    assert second["answer"].endswith("...") and "\n" not in second["answer"]
    assert report["probe"] is None
    assert "realtime_chat samples:" in table and "Q: Why?" in table and "A: Because." in table


def test_report_shows_the_probe_and_fails_on_a_wrong_answer() -> None:
    chat = WorkloadClass.REALTIME_CHAT
    right = RequestResult(
        0, chat, OK, 0.3, 0.1, 8, "w1", chat, 0.0, asked=PROBE_QUESTION,
        text="The capital of France is Paris.", expected="Paris",
    )  # fmt: skip
    other = RequestResult(1, chat, OK, 0.3, 0.1, 8, "w2", chat, 0.0, asked="Hi?", text="Hello.")
    report = build_report([right, other], {})
    assert report["ok"] is True
    assert report["probe"] == {
        "index": 0, "node": "w1", "asked": PROBE_QUESTION, "answer": "The capital of France is Paris.",
        "expected": "Paris", "status": OK,
    }  # fmt: skip
    assert [s["index"] for s in report["samples"]["realtime_chat"]] == [1]  # the probe is shown apart
    table = format_report(report)
    assert f"Q: {PROBE_QUESTION}" in table and "A: The capital of France is Paris." in table
    wrong = RequestResult(
        0, chat, WRONG_ANSWER, 0.3, 0.1, 8, "w1", chat, 0.0, asked=PROBE_QUESTION,
        text="Lyon.", expected="Paris", message="the answer lacks 'Paris'",
    )  # fmt: skip
    report = build_report([wrong, other], {})
    assert report["ok"] is False and report["probe"]["status"] == WRONG_ANSWER
    assert report["classes"]["realtime_chat"]["errors"] == {WRONG_ANSWER: 1}
    assert "WRONG_ANSWER" in format_report(report)
