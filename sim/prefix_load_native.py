"""prefix + load's index match and ranking compiled (csrc/prefix_load.c), loaded with ctypes: one call
per pick where numpy made two dozen. Built as the placer's compiled pick is
(services/placer/pick/native.py: the system C compiler, cached in ~/.cache/hanzo by a hash of the
source); where it cannot be built, or with HANZO_PLACER_NATIVE=0, sim/policies.py ranks in numpy,
which takes the same decisions."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from services.placer.pick import native

_SOURCE = Path(__file__).with_name("csrc") / "prefix_load.c"
_ptr, _i64, _f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled ranking, or None where it is unavailable (the reason logged once)."""
    lib = native.load(
        _SOURCE, "sim_prefix_load", "compiled prefix + load ranking unavailable, ranking in numpy"
    )
    if lib is None:
        return None
    lib.rank_prefix_load.restype = _i64
    lib.rank_prefix_load.argtypes = [
        *(_ptr, _ptr, _i64, _ptr, _i64, _ptr, _i64, _i64),
        *(_f64, _f64, _f64, _f64, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr),
    ]
    lib.match_prefix.restype = _i64
    lib.match_prefix.argtypes = [_ptr, _i64, _ptr, _ptr, _ptr]
    return lib


class PrefixLoadRanking:
    """The compiled ranking and its scratch; create() returns None where it is unavailable."""

    def __init__(self, lib: ctypes.CDLL, queue_weight: float, prefix_weight: float, tolerance: float) -> None:
        self._rank = lib.rank_prefix_load
        self._match = lib.match_prefix
        self._weights = (queue_weight, prefix_weight, tolerance)
        self._mask = np.zeros(0, dtype=np.uint8)  # zeroed between calls
        self._prefix_score = np.zeros(0)
        self._held_at = np.zeros(0, dtype=np.int64)
        self._rows = np.zeros(0, dtype=np.int64)
        self._chain = np.zeros(4 * 8, dtype=np.int64)  # the walk's elements (LlmDPrefixIndex.chain)
        self._drew, self._held = _i64(), _i64()
        self._outs = (ctypes.addressof(self._drew), ctypes.addressof(self._held))
        self._address = native.Addresses(64)  # the columns, the table and the scratch are reused

    @classmethod
    def create(cls, queue_weight: float, prefix_weight: float, tolerance: float) -> PrefixLoadRanking | None:
        lib = library()
        return None if lib is None else cls(lib, queue_weight, prefix_weight, tolerance)

    def rank(
        self,
        waiting: np.ndarray,
        passed: np.ndarray,
        n: int,
        excluded: list[int],
        total_blocks: int,
        chain: list[int],
        uniform: float,
    ) -> tuple[int, bool, int]:
        """(the chosen row or -1, whether the draw was used, the chosen row's blocks of the prompt) over
        rows 0..n: waiting (float64) and passed (bool) per row, the rows left out, and the prompt's blocks
        and elements as LlmDPrefixIndex.chain gives them, walked in C as its match() walks them."""
        self._stage(waiting.size, chain)
        out = np.array(excluded, dtype=np.int64) if excluded else None
        row = self._rank(
            self._address(waiting), self._address(passed), n,
            None if out is None else out.ctypes.data, 0 if out is None else out.size,
            self._address(self._chain), len(chain) // 4, total_blocks, *self._weights, uniform,
            self._address(self._mask), self._address(self._prefix_score), self._address(self._held_at),
            self._address(self._rows), *self._outs,
        )  # fmt: skip
        return int(row), bool(self._drew.value), int(self._held.value)

    def match(self, rows: int, chain: list[int]) -> dict[int, int]:
        """{row: its blocks of the prompt} as the compiled walk matches chain (LlmDPrefixIndex.chain) over
        a snapshot of rows rows: LlmDPrefixIndex.match's rows and blocks, for tests."""
        self._stage(rows, chain)
        found = self._match(
            self._address(self._chain), len(chain) // 4, self._address(self._rows),
            self._address(self._held_at), self._address(self._mask),
        )  # fmt: skip
        matched = self._rows[:found].tolist()
        return dict(zip(matched, self._held_at[matched].tolist(), strict=True))

    def _stage(self, rows: int, chain: list[int]) -> None:
        """Scratch for rows rows, and chain copied where C reads it."""
        if self._mask.size < rows:
            self._mask = np.zeros(rows, dtype=np.uint8)
            self._prefix_score = np.zeros(rows)
            self._held_at = np.zeros(rows, dtype=np.int64)
            self._rows = np.zeros(rows, dtype=np.int64)
        if len(chain) > self._chain.size:
            self._chain = np.zeros(2 * len(chain), dtype=np.int64)
        if chain:
            self._chain[: len(chain)] = chain
