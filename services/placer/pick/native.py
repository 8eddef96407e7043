"""The pick's compiled path (csrc/pick_rows.c): built once per source and machine, loaded with ctypes.

At 8,000 workers a pick rescores a few dozen rows and ranks every row; in numpy each of those steps is
about a hundred calls of a microsecond, whatever the row count, and that per-call cost was most of a
pick. The C path runs the same formulas in two calls. It serves only the standard filters (all four,
or all but not_thermally_critical, as the simulator's baselines run them) and row scorers (filters.py,
scorers.py), recognised by identity with their configs read off; any other filter or scorer keeps the
numpy path, which stays the reference the tests compare against.

Built with the system C compiler into ~/.cache/hanzo (XDG_CACHE_HOME), named by a hash of the source
and flags; `make setup` builds it, so a placer only loads it. Where it cannot be built (no compiler, or
HANZO_PLACER_NATIVE=0), the Picker keeps numpy and the reason is logged once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

ENV_SWITCH = "HANZO_PLACER_NATIVE"  # "0": numpy only
_SOURCE = Path(__file__).with_name("csrc") / "pick_rows.c"
# -ffp-contract=off: no fused multiply-add, so totals round as numpy's separate multiply and add do.
_CFLAGS = ["-O3", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math"]
MAX_SCORERS = 8  # csrc/pick_rows.c: MAX_SCORERS, MAX_REQUEST
MAX_REQUEST = 4

_ptr = ctypes.c_void_p
_i64 = ctypes.c_int64
_f64 = ctypes.c_double
_COLUMN_NAMES = (
    *("live", "draining", "has_thermal", "resident", "host_copy", "listed"),
    *("deadline_s", "running", "waiting", "max_running", "batch_running", "batch_waiting", "kv_usage"),
    *("memory_free_bytes", "temperature_c", "slowdown_c", "shutdown_c", "trend", "reasons"),
    *("zone", "rack", "host", "reserve_rank"),
)
_TABLE_CONSTANTS = (
    *("penalty", "near_band_c", "degraded_slowdown_c", "kv_full_fraction", "shutdown_margin_c"),
    *("span_c", "horizon_s", "scorer_slowdown_c", "no_sample", "batch_kv", "reserve_fraction"),
)


class Columns(ctypes.Structure):
    """csrc/pick_rows.c's Columns: the snapshot's columns and one model's residency."""

    _fields_ = [
        *[(name, _ptr) for name in _COLUMN_NAMES],
        ("weight_bytes", _f64),
    ]


class Table(ctypes.Structure):
    """csrc/pick_rows.c's Table: a RowTable's arrays, scorers and constants."""

    _fields_ = [
        ("passed", _ptr),
        ("degraded", _ptr),
        ("seen", _ptr),
        ("base", _ptr),
        ("scores", _ptr),
        ("capacity", _i64),
        ("n_scorers", _i64),
        ("scorer", _i64 * MAX_SCORERS),
        ("weight", _f64 * MAX_SCORERS),
        ("batch", _i64),
        ("thermal_filter", _i64),
        *[(name, _f64) for name in _TABLE_CONSTANTS],
    ]


class Request(ctypes.Structure):
    """csrc/pick_rows.c's Request: one pick's request scorers, exclusions and the ranking's scratch."""

    _fields_ = [
        ("n_request", _i64),
        ("kind", _i64 * MAX_REQUEST),
        ("weight", _f64 * MAX_REQUEST),
        ("rows", _ptr * MAX_REQUEST),
        ("n_rows", _i64 * MAX_REQUEST),
        ("values", _ptr * MAX_REQUEST),
        ("zone", ctypes.c_int32),
        ("rack", ctypes.c_int32),
        ("host", ctypes.c_int32),
        ("labelled", _ptr * 3),
        ("n_labelled", _i64 * 3),
        ("excluded", _ptr),
        ("n_excluded", _i64),
        *[(name, _ptr) for name in ("touched", "seen", "adjusted", "touched_rows")],
    ]


TOPOLOGY, SPARSE = 0, 1  # Request.kind


def library() -> ctypes.CDLL | None:
    """The compiled pick, or None where it is unavailable (the reason logged once)."""
    return _library()


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = load(_SOURCE, "placer_pick", "compiled pick unavailable, the placer ranks in numpy")
    if lib is None:
        return None
    lib.rescore_rows.restype = _i64
    lib.rescore_rows.argtypes = [_ptr, _ptr, _ptr, _i64, _f64, _ptr]
    lib.rank_rows.restype = _i64
    lib.rank_rows.argtypes = [_ptr, _ptr, _i64, _ptr, _f64, _i64, _ptr, _ptr, _ptr, _ptr]
    return lib


def load(source_path: Path, name: str, unavailable: str) -> ctypes.CDLL | None:
    """The library of source_path built (build) and loaded; None where ENV_SWITCH is "0" or it cannot be
    built or loaded, the reason logged after unavailable."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    try:
        return ctypes.CDLL(str(build(source_path, name)))
    except (OSError, subprocess.CalledProcessError, RuntimeError) as err:
        log.warning("%s: %s", unavailable, err)
        return None


def build(source_path: Path = _SOURCE, name: str = "placer_pick") -> Path:
    """The shared library for this source (the pick's, unless given), flags and machine, compiling it if
    it is not cached yet; name prefixes the cached file."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    source = source_path.read_bytes()
    key = hashlib.sha256(source + " ".join([*_CFLAGS, platform.machine()]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hanzo"
    target = cache / f"{name}_{key}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed: processes building at once never load half a file.
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        partial = Path(scratch) / target.name
        subprocess.run(
            [compiler, *_CFLAGS, "-o", str(partial), str(source_path), "-lm"],
            check=True,
            capture_output=True,
        )
        os.replace(partial, target)
    return target


def address(array: object) -> int:
    """Address of a numpy array's first element (the array must be contiguous and outlive its use)."""
    return array.ctypes.data  # type: ignore[attr-defined]


def pack(values: Sequence[float | int], kind: type, length: int) -> ctypes.Array:  # type: ignore[type-arg]
    """values as a ctypes array of kind and length (the rest zero)."""
    return (kind * length)(*values)


class Addresses:
    """Long-lived arrays' addresses, each looked up once: numpy takes about a microsecond to tell one.
    An entry holds its array, so an id is never reused while remembered; past kept entries (arrays
    replaced as the fleet changes) all are forgotten."""

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._known: dict[int, tuple[object, int]] = {}  # id -> (array, address)

    def __call__(self, array: object) -> int:
        known = self._known.get(id(array))
        if known is None or known[0] is not array:
            if len(self._known) > self._kept:
                self._known.clear()
            known = self._known[id(array)] = (array, address(array))
        return known[1]

    def clear(self) -> None:
        self._known.clear()
