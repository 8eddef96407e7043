"""A clock for code that takes one (`clock=time.monotonic` by default): the test sets `now` itself."""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
