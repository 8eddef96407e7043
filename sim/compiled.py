"""Which copy of the simulator's hot modules runs: the Python source, or the same source compiled.

A 1,000-GPU, 30-minute comparison spends its time in the engine model, the workload, the feed and the
event loop: interpreted Python doing attribute reads and float arithmetic. `python -m sim.mypyc_build`
(run by `make setup`) compiles those modules (sim/mypyc_build.py's MODULES) with mypyc, mypy's compiler,
into C extensions of the very same source; the figures are bit-identical (the same IEEE double
operations in the same order; tests/sim/test_compiled.py runs a simulation both ways and compares every
figure) and a run takes about a fifth less wall.

The build lives in ~/.cache/hanzo (XDG_CACHE_HOME), in a directory named by a hash of every source file of
this package, the Python version and mypy's version. `import sim` puts that directory first on the
package's path only when it holds a complete build of this very source, so an edited module never runs
stale: its hash differs, and the source runs until the next build. HANZO_SIM_COMPILED=0 runs the source
alone; `python -m sim` says which ran ("compiled" in its JSON line).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

ENV_SWITCH = "HANZO_SIM_COMPILED"  # "0": the Python source only
PACKAGE = Path(__file__).resolve().parent
COMPLETE = "BUILD_COMPLETE"  # written last: a directory without it is a build that did not finish


def source_key(package: Path = PACKAGE) -> str:
    """A hash of what a build depends on: every .py of the package (names and bytes), the Python
    version and ABI, the machine, and mypy's version (None when it is not installed)."""
    digest = hashlib.sha256()
    for path in sorted(package.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(f"{sys.implementation.cache_tag} {platform.machine()} {mypy_version()}".encode())
    return digest.hexdigest()[:20]


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hanzo"


def build_dir(key: str | None = None) -> Path:
    """Where the build of this source (or of key) lives."""
    return cache_root() / f"sim-{key or source_key()}"


def activate(package_path: list[str]) -> bool:
    """Put this source's build first on the sim package's path; False (the source runs) when it is
    switched off or there is no complete build of this source. ValueError names a switch that is neither
    0 nor 1 (a typo must not run the other copy unnoticed)."""
    switch = os.environ.get(ENV_SWITCH, "1")
    if switch not in ("0", "1"):
        raise ValueError(f"{ENV_SWITCH}={switch!r}: use 1 (this source's build, where there is one) or 0")
    if switch == "0":
        return False
    built = build_dir()
    if not (built / COMPLETE).is_file():
        return False
    package_path.insert(0, str(built / "sim"))
    return True


def mypy_version() -> str | None:
    try:
        return metadata.version("mypy")
    except metadata.PackageNotFoundError:
        return None
