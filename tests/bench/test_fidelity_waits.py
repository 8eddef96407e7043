"""bench/fidelity_waits.py: a served request's wait, split by what its worker's logged steps did."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.fidelity_waits import Step, explain, main, read_steps
from sim.fit import TERMS

T0 = 1_000.0  # the repeat's time 0 on the wall clock
COST = dict.fromkeys(TERMS, 0.0) | {"base_s": 0.5}  # every step predicted at 0.5 s a batch


def step(
    worker: str,
    start: float,
    end: float,
    chunks: Sequence[tuple[str, int, int]] = (),
    added: dict[str, float] | None = None,
    running: int = 1,
) -> Step:
    return Step(worker, T0 + start, T0 + end, (1, 0, 0, 0, 0), tuple(chunks), added or {}, running)


def row(arrival_s: float, ttft_s: float) -> dict[str, object]:
    return {"workload": "realtime_chat", "session": 7, "turn": 1, "prompt": 300, "cached": 0,
            "ttft_s": ttft_s, "node": "w1", "arrival_s": arrival_s}  # fmt: skip


CLASSES = {"fidelity-7-1": "realtime_chat", "fidelity-2-0": "batch", "fidelity-3-0": "agent_tool"}


def test_a_wait_is_split_into_what_its_worker_ran() -> None:
    steps = [
        # sent at 10.0, taken by the engine at 10.2 while a batch prompt's step ran (10.0-11.0)
        step("w1", 10.0, 11.0, [("fidelity-2-0", 0, 500)], {"fidelity-7-1": T0 + 10.2}, running=8),
        step("w1", 11.0, 11.5, running=8),  # decodes only, every seat taken
        step("w1", 11.5, 11.7),  # idle 11.7-12.0, then its own two chunks beside an agent prompt's
        step("w1", 12.0, 12.6, [("fidelity-7-1", 0, 256), ("fidelity-3-0", 0, 40)]),
        step("w1", 12.6, 13.0, [("fidelity-7-1", 256, 44)]),
        step("w2", 10.0, 11.5),  # the other worker, busy half of the 3.1 s wait
        step("w2", 20.0, 21.0),
    ]
    e = explain(row(10.0, 3.1), T0, steps, CLASSES, COST, seats=8)
    assert e["found"] and e["worker"] == "w1" and not e["nested"] and e["moved_from"] == []
    assert e["to_engine_s"] == e["to_this_engine_s"] == 0.2 and e["queued_s"] == 1.8
    assert e["queued_in"] == {"batch prompts": 0.8, "decodes only": 0.7}
    assert e["idle_s"] == 0.3 and e["seats_full_steps"] == 2
    assert e["own_chunks"] == [[0, 256], [256, 44]] and e["prompt_tokens_beside"] == 40
    assert e["own_steps_s"] == 1.0 and e["own_steps_predicted_s"] == 1.0
    assert e["tail_s"] == 0.1
    assert e["other_worker_busy"] == round(1.5 / 3.1, 3)


def test_a_chunk_nested_in_a_running_step_did_not_queue() -> None:
    # The step began before the request was sent: its urgent chunk joined the step as it ran.
    steps = [
        step(
            "w1",
            9.0,
            10.5,
            [("fidelity-2-0", 0, 900), ("fidelity-7-1", 0, 300)],
            {"fidelity-7-1": T0 + 10.05},
        )
    ]
    e = explain(row(10.0, 0.6), T0, steps, CLASSES, COST, seats=8)
    assert e["nested"] and e["queued_s"] == 0 and e["to_engine_s"] == 0.05


def test_a_request_refused_by_one_worker_and_moved_counts_its_time_there() -> None:
    # w2 took it at once and refused it when the chat queue timeout (5 s) expired; the gateway moved it.
    steps = [
        step("w2", 10.0, 10.5, added={"fidelity-7-1": T0 + 10.01}),
        step("w1", 15.0, 15.2, added={"fidelity-7-1": T0 + 15.1}),
        step("w1", 15.2, 15.6, [("fidelity-7-1", 0, 300)]),
    ]
    e = explain(row(10.0, 5.7), T0, steps, CLASSES, COST, seats=8)
    assert e["worker"] == "w1" and e["moved_from"] == [["w2", 0.01]]
    assert e["to_engine_s"] == 0.01 and e["to_this_engine_s"] == 5.1 and e["queued_s"] == 0.1


def test_a_request_of_another_repeat_is_not_found() -> None:
    steps = [step("w1", 200.0, 201.0, [("fidelity-7-1", 0, 300)])]  # the same id, a later repeat
    assert explain(row(10.0, 0.5), T0, steps, CLASSES, COST, seats=8) == {
        "workload": "realtime_chat", "session": 7, "turn": 1, "prompt": 300, "cached": 0, "ttft_s": 0.5,
        "node": "w1", "found": False,
    }  # fmt: skip


def test_step_logs_are_read_in_order_of_their_start(tmp_path: Path) -> None:
    lines = [
        {"batches": 1, "rows": 2, "context": 40, "prefill": 0, "attention": 0, "seconds": 0.5, "end": 12.0,
         "chunks": [], "added": [["fidelity-7-1", 11.7]], "running": 2},
        {"batches": 1, "rows": 0, "context": 0, "prefill": 8, "attention": 36, "seconds": 1.0, "end": 11.0,
         "chunks": [["fidelity-2-0", 0, 8]], "added": [], "running": 0},
    ]  # fmt: skip
    (tmp_path / "worker-11-smollm2.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"cut')
    steps = read_steps(tmp_path, "smollm2")
    assert [(s.start, s.end) for s in steps] == [(10.0, 11.0), (11.5, 12.0)]
    assert steps[1].added == {"fidelity-7-1": 11.7} and steps[1].features == (1, 2, 40, 0, 0)
    assert steps[0].chunks == (("fidelity-2-0", 0, 8),)


def _saved_run(tmp_path: Path, step_line: dict[str, object]) -> Path:
    """A bench/sim_fidelity.py result, its requests file and one worker's step log, as the bench writes."""
    result = tmp_path / "sim_fidelity.json"
    result.write_text(
        json.dumps(
            {"mesh": {"repeat_started_unix": [T0]}, "profile": {"max_running": 8},
             "calibration": {"coefficients": {"smollm2": COST}}}
        )
    )  # fmt: skip
    real = {**row(10.0, 0.6), "repeat": 0}
    sim = {**row(10.0, 0.5), "node": "w2"}
    (tmp_path / "sim_fidelity_requests.json").write_text(json.dumps({"real": [real], "sim": [sim]}))
    logs = tmp_path / "sim_fidelity_steps" / "evaluation"
    logs.mkdir(parents=True)
    (logs / "worker-11-smollm2.jsonl").write_text(json.dumps(step_line) + "\n")
    return result


STEP_LINE = {
    "batches": 1, "rows": 0, "context": 0, "prefill": 300, "attention": 45150, "seconds": 0.5,
    "end": T0 + 10.55, "chunks": [["fidelity-7-1", 0, 300]], "added": [["fidelity-7-1", T0 + 10.02]],
    "running": 0,
}  # fmt: skip


def test_the_command_explains_a_saved_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--result", str(_saved_run(tmp_path, STEP_LINE))]) == 0
    *lines, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 1 and lines[0]["to_engine_s"] == 0.02 and lines[0]["sim_ttft_s"] == 0.5
    assert summary["requests"] == summary["found"] == 1 and summary["ttft_s_median"] == 0.6


def test_the_command_refuses_what_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--result", str(tmp_path / "none.json")]) == 2
    assert "none.json is missing" in capsys.readouterr().err
    old = {k: v for k, v in STEP_LINE.items() if k not in ("end", "chunks", "added", "running")}
    assert main(["--result", str(_saved_run(tmp_path, old))]) == 2
    assert "no wall-clock times" in capsys.readouterr().err
    for bad in (["--workload", "embedding"], ["--top", "0"]):
        with pytest.raises(SystemExit) as refused:
            main(bad)
        assert refused.value.code == 2
