"""Progress lines of every benchmark: on stderr, so stdout carries only the one JSON line."""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    """Print msg to stderr with a wall-clock stamp, flushed (benchmarks run for minutes)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
