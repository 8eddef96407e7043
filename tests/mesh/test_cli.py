"""hanzo-mesh: workload plan, report, argument parsing, child processes, the driver against a fake
gateway, and (once the worker and gateway exist) the whole demo as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc
from services.common.redis_server import RedisServer
from services.common.workload import WorkloadClass
from services.mesh.cli import build_parser
from services.mesh.driver import OK, DriveOptions, RequestResult, drive
from services.mesh.models import BATCH_MODEL, CHAT_MODEL, EMBED_MODEL
from services.mesh.process import ROOT, ChildProcess, ServiceStartError
from services.mesh.report import build_report, format_report, percentile, write_report
from services.mesh.workload import DEFAULT_MIX, PlannedRequest, class_counts, plan_workload

ALL_CLASSES = set(DEFAULT_MIX)


# --- workload plan -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 24, 120, 1000])
def test_class_counts_add_up_and_cover_every_class(n: int) -> None:
    counts = class_counts(n)
    assert sum(counts.values()) == n
    if n >= len(ALL_CLASSES):
        assert all(counts[c] >= 1 for c in ALL_CLASSES)


def test_plan_is_seeded() -> None:
    assert plan_workload(120, seed=7) == plan_workload(120, seed=7)
    assert plan_workload(120, seed=7) != plan_workload(120, seed=8)


@pytest.mark.parametrize("n", [4, 24, 120])
def test_plan_has_every_class_in_arrival_order(n: int) -> None:
    plan = plan_workload(n, seed=0, rate_rps=6.0)
    assert [p.index for p in plan] == list(range(n))
    assert {p.workload_class for p in plan} == ALL_CLASSES
    arrivals = [p.arrival_s for p in plan]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0


def test_plan_requests_fit_their_class() -> None:
    plan = plan_workload(120, seed=3)
    by = {c: [p for p in plan if p.workload_class is c] for c in ALL_CLASSES}
    assert all(p.model == EMBED_MODEL and p.texts and not p.prompt for p in by[WorkloadClass.EMBEDDING])
    assert all(p.model == BATCH_MODEL and p.declare_class and p.ignore_eos for p in by[WorkloadClass.BATCH])
    assert all(p.model == CHAT_MODEL and p.max_tokens <= 32 for p in by[WorkloadClass.REALTIME_CHAT])
    # Batch documents are long, agent calls short; some chats leave classification to the gateway.
    assert min(len(p.prompt) for p in by[WorkloadClass.BATCH]) > max(
        len(p.prompt) for p in by[WorkloadClass.REALTIME_CHAT]
    )
    assert max(p.max_tokens for p in by[WorkloadClass.AGENT_TOOL]) <= 16
    assert {p.declare_class for p in by[WorkloadClass.REALTIME_CHAT]} == {True, False}
    assert plan_workload(8, seed=3, batch_model=CHAT_MODEL)[0].model != BATCH_MODEL


@pytest.mark.parametrize(("n", "rate"), [(0, 1.0), (5, 0.0)])
def test_plan_rejects_bad_arguments(n: int, rate: float) -> None:
    with pytest.raises(ValueError):
        plan_workload(n, seed=0, rate_rps=rate)


# --- report -------------------------------------------------------------------------------------


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
        RequestResult(0, chat, OK, 0.5, 0.1, 20, "w1", chat, 0.0),
        RequestResult(1, chat, OK, 0.7, 0.2, 30, "w2", chat, 0.5),
        RequestResult(2, chat, "UNAVAILABLE", 0.1, sent_at_s=1.0, message="no worker"),
        RequestResult(3, emb, OK, 0.05, node_id="w1", sent_at_s=0.2),
    ]


def test_report_json_shape(tmp_path: Path) -> None:
    report = build_report(_results(), {"seed": 1})
    assert set(report) == {"meta", "classes", "total", "ok"}
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


# --- argument parsing ---------------------------------------------------------------------------


def test_parser_defaults() -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.workers, args.requests, args.seed, args.redis_url, args.base_port) == (2, 120, 0, None, None)
    assert args.report == Path(".cache/mesh/demo-report.json")
    assert args.model_cache == Path(".cache/mesh/models")
    up = build_parser().parse_args(
        ["up", "--workers", "3", "--base-port", "40000", "--redis-url", "redis://x"]
    )
    assert (up.command, up.workers, up.base_port, up.redis_url) == ("up", 3, 40000, "redis://x")


@pytest.mark.parametrize(
    "argv",
    [[], ["demo", "--workers", "0"], ["demo", "--requests", "-1"], ["up", "--base-port", "70000"], ["down"]],
)
def test_parser_rejects(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)


# --- child processes ----------------------------------------------------------------------------


def test_child_that_exits_early_reports_its_log_tail(tmp_path: Path) -> None:
    child = ChildProcess("ghost", "services.mesh.no_such_module", {}, "GHOST_READY", tmp_path / "g.log")
    with pytest.raises(ServiceStartError, match=r"ghost exited with code 1(.|\n)*No module named"):
        child.wait_ready(30)


def test_placer_child_becomes_ready_and_stops_cleanly(tmp_path: Path, redis_server: RedisServer) -> None:
    env = {
        "HANZO_PLACER_PORT": "0",
        "HANZO_PLACER_METRICS_PORT": "0",
        "HANZO_PLACER_REDIS_URL": redis_server.url,
    }
    child = ChildProcess("placer", "services.placer", env, "PLACER_READY", tmp_path / "placer.log")
    try:
        ready = child.wait_ready(60)
        assert ready["address"].startswith("127.0.0.1:") and int(ready["metrics_port"]) > 0
    finally:
        child.terminate()
        assert child.wait_or_kill(15) == 0


# --- driver against an in-process fake gateway --------------------------------------------------


class FakeGateway(inference_pb2_grpc.InferenceServicer):
    """Streams max_tokens tokens two at a time; unknown models get NOT_FOUND; checks the API key."""

    def __init__(self, api_key: str = "k") -> None:
        self.api_key = api_key

    async def Generate(self, request, context) -> AsyncIterator[inference_pb2.GenerateResponse]:
        md = dict(context.invocation_metadata())
        if md.get("authorization") != f"Bearer {self.api_key}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad key")
        if request.model not in (CHAT_MODEL, BATCH_MODEL):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.model}")
        cls = request.workload_class or (
            WorkloadClass.AGENT_TOOL
            if md.get("x-hanzo-workload") == "agent_tool"
            else WorkloadClass.REALTIME_CHAT
        )
        node = "w2" if request.model == BATCH_MODEL else "w1"
        yield inference_pb2.GenerateResponse(workload_class=cls, node_id=node)
        n = request.sampling.max_tokens
        for start in range(0, n, 2):
            yield inference_pb2.GenerateResponse(token_ids=list(range(start, min(n, start + 2))))
        yield inference_pb2.GenerateResponse(
            finish_reason=inference_pb2.FINISH_REASON_LENGTH, usage=inference_pb2.Usage(completion_tokens=n)
        )

    async def Embed(self, request, context) -> inference_pb2.EmbedResponse:
        data = [inference_pb2.Embedding(values=[0.1, 0.2], index=i) for i in range(len(request.inputs))]
        return inference_pb2.EmbedResponse(data=data, node_id="w1")


async def test_driver_against_fake_gateway() -> None:
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(FakeGateway(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        plan = plan_workload(16, seed=1, rate_rps=200.0)
        plan.append(PlannedRequest(16, WorkloadClass.REALTIME_CHAT, 0.0, "nope", "hi", 4))
        seen: list[int] = []
        results = await drive(
            f"127.0.0.1:{port}", "k", plan, DriveOptions(max_in_flight=4), lambda r: seen.append(r.index)
        )
    finally:
        await server.stop(None)
    assert sorted(seen) == list(range(17)) and [r.index for r in results] == list(range(17))
    assert results[16].status == "NOT_FOUND"
    for p, r in zip(plan[:16], results[:16], strict=True):
        assert r.status == OK, r
        if p.workload_class is WorkloadClass.EMBEDDING:
            assert r.ttft_s is None and r.node_id == "w1"
        else:
            assert r.output_tokens == p.max_tokens and 0 < r.ttft_s <= r.e2e_s
            assert r.served_class is p.workload_class  # agent calls classified by their metadata
    report = build_report(results, {})
    assert report["classes"]["batch"]["nodes"] == {"w2": report["classes"]["batch"]["requests"]}
    assert report["classes"]["realtime_chat"]["errors"] == {"NOT_FOUND": 1}


# --- the whole demo -----------------------------------------------------------------------------


def test_demo_end_to_end(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    argv = ["demo", "--workers", "2", "--requests", "24", "--no-progress"]
    argv += ["--report", str(report_path), "--run-root", str(tmp_path / "runs")]
    proc = subprocess.run(
        [sys.executable, "-m", "services.mesh", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}"
    report = json.loads(report_path.read_text())
    assert report["ok"] is True and report["total"]["requests"] == 24
    for name, stats in report["classes"].items():
        assert stats["requests"] >= 1 and stats["ok"] == stats["requests"], name
    assert set(report["total"]["nodes"]) == {"mesh-w1", "mesh-w2"}, report["total"]["nodes"]
    assert all(code == 0 for code in report["meta"]["exit_codes"].values()), report["meta"]["exit_codes"]
