"""hanzo-mesh: argument parsing, child processes, and the whole demo on the real models as a
subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.redact import redact_url
from services.common.redis_server import RedisServer
from services.mesh.cli import build_parser
from services.mesh.models import CHAT_MODEL, EMBED_MODEL
from services.mesh.process import ROOT, ChildProcess, ServiceStartError
from services.mesh.workload import PROBE_QUESTION
from tests.mesh.test_serve import clear_redis_passwords

# --- argument parsing ---------------------------------------------------------------------------


def test_parser_defaults() -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.workers, args.requests, args.seed, args.redis_url, args.base_port) == (2, 120, 0, None, None)
    assert args.report == Path(".cache/mesh/demo-report.json")
    assert (args.time_budget, args.request_timeout, args.concurrency) == (180.0, 90.0, 8)
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
    log = (tmp_path / "placer.log").read_text()
    assert f"(redis {redact_url(redis_server.url)})" in log  # where it reads from, without the password
    assert redis_server.password not in log


# --- the whole demo -----------------------------------------------------------------------------


def test_demo_end_to_end(tmp_path: Path) -> None:
    """The real demo on SmolLM2 and MiniLM: every request served, by both workers, and the model's
    answers are real (the greedy probe names Paris). About a minute on an idle 2-core machine; the
    deadlines are generous because this checks correctness, and a machine busy with other work can make
    the lowest-priority batch documents wait past the demo's default deadline."""
    report_path = tmp_path / "report.json"
    argv = ["demo", "--workers", "2", "--requests", "24", "--no-progress"]
    argv += ["--request-timeout", "240", "--time-budget", "240"]
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
    assert report["meta"]["restarts"] == {}  # supervised, and nothing needed restarting
    # A real model answered: the greedy probe names Paris, and there are real answers to show.
    probe = report["probe"]
    assert probe["status"] == "OK" and "Paris" in probe["answer"], probe
    assert probe["asked"] == PROBE_QUESTION
    for name in ("realtime_chat", "agent_tool", "batch"):
        samples = report["samples"][name]
        assert samples and all(s["asked"] and s["answer"].strip() for s in samples), (name, samples)
    assert report["classes"]["agent_tool"]["classified_as"] == {
        "agent_tool": report["classes"]["agent_tool"]["ok"]
    }
    worker_models = report["meta"]["worker_models"]
    assert all(sorted(m) == sorted([CHAT_MODEL, EMBED_MODEL]) for m in worker_models.values()), worker_models
    assert f"Q: {PROBE_QUESTION}" in proc.stdout and "realtime_chat samples:" in proc.stdout
    # The process table names the private Redis redacted; no output or service log shows its password.
    assert "redis redis://:***@127.0.0.1:" in proc.stdout
    assert clear_redis_passwords(tmp_path / "runs", proc.stdout, proc.stderr) == []
