"""python -m sim.mypyc_build: compile the simulator's hot modules with mypyc (sim/compiled.py says why
and how the build is found). Optional: without mypy or a C compiler the simulator runs its source.

mypy type-checks the modules it compiles and reads the rest of the repository (the placer's state and
picker, the generated protobufs) for their types only (--follow-imports=silent): the services are not
type-checked as a whole, and an error of theirs must not stop this build.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sim.compiled import COMPLETE, PACKAGE, build_dir, cache_root, source_key

# The modules every simulated event runs through. The rest (profiles, fleet, calibration, plotting, the
# CLI) run once per simulation and stay interpreted.
MODULES = (
    "request", "prefix_cache", "step_budget", "residency", "admission", "encoder_path", "engine_model",
    "workload", "thermal", "results", "feed", "llm_d_prefix", "policies", "worker_loads", "planner",
    "simulation",
)  # fmt: skip
_GROUP = "sim._hot"  # the modules' shared library: sim/_hot__mypyc...so, inside the build's package


def build() -> Path:
    """Compile MODULES into build_dir() (nothing to do when it holds a build of this source); its path.
    Raises ImportError without mypy, SystemExit when mypy or the C compiler fails, leaving no partial
    build behind; a new build removes the builds of older sources."""
    from mypyc.build import mypycify  # the sim extra's dependency, needed only here
    from setuptools import setup

    key = source_key()
    target = build_dir(key)
    if (target / COMPLETE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        work, out = Path(scratch) / "c", Path(scratch) / "out"
        paths = [f"sim/{name}.py" for name in MODULES]
        cwd = Path.cwd()
        os.chdir(PACKAGE.parent)  # mypy resolves `sim.*` and the services it imports from the repository
        try:
            extensions = mypycify(
                ["--follow-imports=silent", *paths], target_dir=str(work), group_name=_GROUP, opt_level="3"
            )
            setup(
                name="hanzo-sim-compiled",
                ext_modules=extensions,
                script_args=["build_ext", "--build-lib", str(out), "--build-temp", str(work / "t"), "-q"],
            )
        finally:
            os.chdir(cwd)
        (out / COMPLETE).write_text(key + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(out, target)  # the complete build appears at once
    for old in cache_root().glob("sim-*"):
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    return target


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """This process's stdout and stderr (the compiler's too: it inherits the descriptors) into log."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log.open("wb") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def main() -> int:
    """Build, or say in one line why the simulator keeps its Python source (the build's output, mypy's
    and the compiler's, in a log beside it); 0 either way, as the build is optional."""
    cache_root().mkdir(parents=True, exist_ok=True)
    log = cache_root() / "sim-build.log"
    try:
        with _output_to(log):
            where = build()
    except (ImportError, SystemExit, OSError) as error:  # no mypy, no compiler, a type error
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        print(f"{tail}sim.mypyc_build: not built ({error!r}; the whole log: {log}); the source runs")
        return 0
    print(f"sim.mypyc_build: {len(MODULES)} modules compiled in {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
