"""python -m sim as a user runs it: one JSON line, a plot, and a precise refusal of a wrong policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_a_run_prints_one_json_line_and_writes_the_plot(tmp_path: Path) -> None:
    plot = tmp_path / "fleet.png"
    done = sim(
        "--hosts", "2", "--minutes", "0.5", "--policies", "random,ours", "--jobs", "1", "--plot", str(plot)
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["gpus"] == 16 and out["simulated_s"] == 30.0 and set(out["policies"]) == {"random", "ours"}
    chat = out["policies"]["ours"]["classes"]["realtime_chat"]
    assert chat["completed"] > 0 and 0.0 <= chat["slo_attainment"] <= 1.0
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_an_unknown_policy_is_refused_with_the_known_ones() -> None:
    done = sim("--policies", "ours,fastest")
    assert done.returncode == 2
    assert "fastest" in done.stderr and "least_loaded" in done.stderr


def test_a_fleet_or_run_of_no_size_is_refused_naming_the_flag() -> None:
    for flag, value in (("--hosts", "0"), ("--minutes", "-1"), ("--jobs", "two")):
        done = sim(flag, value)
        assert done.returncode == 2 and flag in done.stderr, (flag, done.stderr)


def test_weights_reach_our_policy_and_a_bad_file_is_refused_naming_the_scorer(tmp_path: Path) -> None:
    weights = tmp_path / "weights.json"
    weights.write_text(json.dumps({"realtime_chat": {"prefix_affinity": 0.6}}))
    done = sim(
        "--hosts", "1", "--minutes", "0.2", "--policies", "ours", "--jobs", "1", "--weights", str(weights)
    )
    assert done.returncode == 0, done.stderr
    used = json.loads(done.stdout)["policies"]["ours"]["class_weights"]
    assert used["realtime_chat"]["prefix_affinity"] == 0.6
    assert used["agent_tool"]["prefix_affinity"] == 0.1  # the other classes keep the defaults
    weights.write_text(json.dumps({"realtime_chat": {"prefix_afinity": 0.6}}))
    done = sim("--weights", str(weights))
    assert done.returncode == 2 and "prefix_afinity" in done.stderr and "--weights" in done.stderr


def test_host_copies_and_the_planner_reach_the_run_and_an_unknown_model_is_refused() -> None:
    done = sim(
        "--hosts", "1", "--minutes", "0.2", "--policies", "ours", "--jobs", "1", "--planner",
        "--host-copies", "llama-70b,llama-8b",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ours = json.loads(done.stdout)["policies"]["ours"]
    assert ours["replica_planner"] is not None and "loads_from_host_copy" in ours["model_loads"]
    done = sim("--host-copies", "llama-7b")
    assert done.returncode == 2 and "--host-copies ['llama-7b']" in done.stderr, done.stderr
    assert "--weights" not in done.stderr


def test_the_node_reserve_reaches_our_policy_and_a_share_past_1_is_refused(tmp_path: Path) -> None:
    weights = tmp_path / "weights.json"
    weights.write_text(json.dumps({"batch": {"node_reserve": 1.0}, "realtime_chat": {"node_reserve": 0.3}}))
    done = sim(
        "--hosts", "1", "--minutes", "0.2", "--policies", "ours,random", "--jobs", "1", "--weights",
        str(weights), "--node-reserve", "0.5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    policies = json.loads(done.stdout)["policies"]
    assert policies["ours"]["node_reserve_fraction"] == 0.5
    assert policies["ours"]["class_weights"]["batch"]["node_reserve"] == 1.0
    assert policies["random"]["node_reserve_fraction"] is None  # the baselines have no reserve
    for bad in ("1.5", "nan"):
        done = sim("--node-reserve", bad)
        assert done.returncode == 2 and f"--node-reserve {bad}" in done.stderr, done.stderr
