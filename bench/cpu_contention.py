"""How much CPU other processes (and the hypervisor) took while a benchmark phase ran, from /proc (Linux).

On a small shared machine another job's burst can slow a phase several-fold (torch's threads then wait on
a core they do not have); a phase's latency numbers mean little without this beside them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class _Sample:
    wall: float
    busy: float  # CPU seconds every process on the machine has used (all cores)
    steal: float  # CPU seconds the hypervisor gave to other machines
    own: float  # CPU seconds this process has used


def _sample() -> _Sample | None:
    try:
        fields = _PROC_STAT.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) / hz for x in fields[:8])
    times = os.times()
    return _Sample(time.monotonic(), user + nice + system + irq + softirq, steal, times.user + times.system)


class CpuMeter:
    """Brackets one phase: `done()` says how many cores others used on average since construction."""

    def __init__(self) -> None:
        self._start = _sample()

    def done(self) -> dict[str, float] | None:
        """{"other_cores": mean cores busy outside this process, "steal_cores": mean cores the hypervisor
        took, "own_cores": mean cores this process used}; None where /proc/stat is unreadable."""
        end = _sample()
        start = self._start
        if start is None or end is None or end.wall <= start.wall:
            return None
        wall = end.wall - start.wall
        own = end.own - start.own
        return {
            "other_cores": round(max(0.0, end.busy - start.busy - own) / wall, 3),
            "steal_cores": round((end.steal - start.steal) / wall, 3),
            "own_cores": round(own / wall, 3),
        }
