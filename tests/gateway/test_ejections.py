"""Ejections on a clock the test moves: a worker is left out for eject_s after its link broke, a second
failure meanwhile extends it, and eject_s 0 turns ejection off."""

from __future__ import annotations

from services.gateway.ejections import Ejections
from tests.manual_clock import ManualClock

# (seconds since the start, node ejected then or None, the nodes left out afterwards)
STEPS = [
    (0.0, "w1", ["w1"]),
    (1.0, "w2", ["w1", "w2"]),
    (4.9, None, ["w1", "w2"]),
    (5.0, None, ["w2"]),  # w1's five seconds are up: offered again
    (5.5, "w2", ["w2"]),  # failed again while out: out for five more seconds from now
    (10.4, None, ["w2"]),
    (10.5, None, []),
]


def test_ejections_expire_and_extend() -> None:
    clock = ManualClock(50.0)
    ejections = Ejections(5.0, clock=clock)
    start = clock.now
    for at, node, expected in STEPS:
        clock.now = start + at
        if node is not None:
            ejections.eject(node, "its link broke")
        assert ejections.active() == expected, at


def test_zero_eject_s_never_ejects() -> None:
    ejections = Ejections(0.0)
    ejections.eject("w1", "its link broke")
    assert ejections.active() == []
