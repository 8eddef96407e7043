"""sim/memo_reach.py: the gateway's prefix chains for the simulator's sessions, replayed through the
real PrefixMemo."""

from __future__ import annotations

import json

import pytest

from services.common.workload import WorkloadClass
from sim.compare import CONVERSATIONS
from sim.config import Models, WorkloadConfig
from sim.fleet import FleetLayout
from sim.memo_reach import chain, main, replay
from sim.sharegpt import conversations
from sim.trace import Trace, TraceSession, build_trace


@pytest.fixture(scope="module")
def trace() -> Trace:
    layout = FleetLayout(hosts=2)
    config = WorkloadConfig(duration_s=60.0)
    return build_trace(config, layout.gpus, ["zone-0"], conversations(CONVERSATIONS), 0, Models())


def _sessions(trace: Trace, workload: WorkloadClass) -> list[TraceSession]:
    return [s for s in trace.sessions if s.workload == workload]


def test_a_later_turn_shares_every_whole_block_of_the_turn_before(trace: Trace) -> None:
    for session in _sessions(trace, WorkloadClass.REALTIME_CHAT) + _sessions(trace, WorkloadClass.AGENT_TOOL):
        for k in range(1, len(session.turns)):
            before, now = chain(session, k - 1), chain(session, k)
            whole = (
                before if session.prompt(k - 1) % 128 == 0 else before[:-1]
            )  # its partial block is its own
            assert now[: len(whole)] == whole[: len(now)]
            assert len(now) <= 64


def test_sessions_share_their_tenants_tools_and_their_jobs_instruction(trace: Trace) -> None:
    for workload in (WorkloadClass.AGENT_TOOL, WorkloadClass.BATCH):
        by_shared: dict[int, list[TraceSession]] = {}
        for session in _sessions(trace, workload):
            by_shared.setdefault(session.shared_key, []).append(session)
        a, b = next(group for group in by_shared.values() if len(group) > 1)[:2]
        shared = a.shared_tokens // 128
        assert shared > 0 and chain(a, 0)[:shared] == chain(b, 0)[:shared]
        assert chain(a, 0)[shared] != chain(b, 0)[shared]  # the rest is each session's own


def test_a_large_memo_finds_every_history_and_none_finds_nothing(trace: Trace) -> None:
    everything = replay(trace.sessions, 10**8)
    assert everything["chat_later_turns"] == everything["agent_later_turns"] == {"own": 1.0}
    nothing = replay(trace.sessions, 0)
    assert all(found == {"none": 1.0} for found in nothing.values())
    small = replay(trace.sessions, 200)
    assert 0.0 < small["chat_later_turns"].get("own", 0.0) < 1.0  # type: ignore[attr-defined]


def test_it_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hosts", "1", "--minutes", "0.5", "--capacities", "0,1000000"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == 8 and out["elements_written"] > 0
    assert set(out["capacities"]) == {"0", "1000000"}


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--capacities", "1000,lots"], "'lots' is not an int"),
        (["--capacities", "-5"], "must be >= 0, got -5"),
        (["--capacities", ","], "give at least one number"),
        (["--minutes", "0"], "must be > 0, got 0"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert words in capsys.readouterr().err
