"""The simulator's hot modules compiled with mypyc (sim/compiled.py) against their Python source: the same
runs both ways must give every figure bit for bit, and say which ran."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sim.compiled import COMPLETE, build_dir, mypy_version

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--hosts", "4", "--minutes", "1"]
RUNS = (
    # Every policy on the default fleet, in two processes as a comparison runs (its configuration
    # pickled across); ours again with models moving (worker_loads.py, planner.py).
    [*SMALL, "--jobs", "2"],
    [*SMALL, "--jobs", "1", "--policies", "ours", "--planner", "--host-copies", "llama-70b,llama-8b"],
)
_TIMINGS = ("wall_s", "pick_us_mean")  # how long it took, not what it found

_compiler = shutil.which(str(sysconfig.get_config_var("CC") or "cc").split()[0])
pytestmark = pytest.mark.skipif(
    mypy_version() is None or _compiler is None,
    reason="mypy (the sim extra) or a C compiler is missing: the simulator runs its source only",
)


def _simulate(args: list[str], compiled: bool) -> dict[str, object]:
    env = {**os.environ, "HANZO_SIM_COMPILED": "1" if compiled else "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "sim", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    figures = json.loads(done.stdout)
    figures.pop("wall_s")
    for run in figures["policies"].values():
        for key in _TIMINGS:
            run.pop(key)
    return figures


@pytest.fixture(scope="module")
def built() -> Path:
    """This source's build: made by `make setup`, or here (minutes) when the source changed since."""
    if not (build_dir() / COMPLETE).is_file():
        subprocess.run([sys.executable, "-m", "sim.mypyc_build"], cwd=ROOT, timeout=1200, check=True)
    assert (build_dir() / COMPLETE).is_file(), "the build failed: `python -m sim.mypyc_build` says why"
    return build_dir()


@pytest.mark.parametrize("args", RUNS, ids=["all-policies", "ours-planner"])
def test_compiled_runs_give_every_figure_of_the_source(built: Path, args: list[str]) -> None:
    compiled, source = _simulate(args, compiled=True), _simulate(args, compiled=False)
    assert compiled.pop("compiled") is True and source.pop("compiled") is False
    assert compiled == source


def test_an_edited_source_runs_uncompiled_until_rebuilt(built: Path, tmp_path: Path) -> None:
    """The build is keyed by the source: one module changed and the key moves; a process that finds no
    build of its key (here: an empty cache) runs the source and says so."""
    from sim.compiled import source_key

    copy = tmp_path / "sim"
    shutil.copytree(ROOT / "sim", copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert source_key(copy) == built.name.removeprefix("sim-")
    engine = copy / "engine_model.py"
    engine.write_text(engine.read_text() + "\n# edited\n")
    assert source_key(copy) != built.name.removeprefix("sim-")
    probe = [sys.executable, "-c", "import sim; print(sim.COMPILED)"]
    for cache, switch, expected in ((str(tmp_path), "1", "False"), (None, "0", "False"), (None, "1", "True")):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HANZO_SIM_COMPILED": switch}
        if cache is not None:
            env["XDG_CACHE_HOME"] = cache
        out = subprocess.run(probe, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected, (cache, switch)


def test_a_switch_that_is_neither_0_nor_1_is_refused_by_name() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HANZO_SIM_COMPILED": "false"}
    probe = [sys.executable, "-c", "import sim"]
    out = subprocess.run(probe, cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "HANZO_SIM_COMPILED='false': use 1" in out.stderr
