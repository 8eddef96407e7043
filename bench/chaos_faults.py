"""bench/chaos.py's fault schedule: seeded, so two runs inject the same faults at the same times, and the
injection itself (signals to the services `hanzo-mesh up` runs)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
from dataclasses import dataclass

# What each kind does to which service: SIGKILL (the supervisor must restart it) or SIGSTOP (hung: its
# sockets stay open; continued after STOP_FOR_S).
KINDS: dict[str, tuple[str, signal.Signals]] = {
    "kill_worker": ("worker", signal.SIGKILL),
    "stop_worker": ("worker", signal.SIGSTOP),
    "kill_placer": ("placer", signal.SIGKILL),
    "kill_telemetry": ("telemetry", signal.SIGKILL),
    "kill_redis": ("redis", signal.SIGKILL),
}
STOP_FOR_S = 8.0  # longer than the gateway's keepalive (about 4 s) and the placer's node TTL (3 s)


@dataclass
class Fault:
    """One planned fault. at_s: seconds after the load started. target: the service's name as
    UpProcess.services() gives it, chosen when the schedule is made."""

    kind: str
    target: str
    at_s: float
    pid: int = 0
    injected_at: float | None = None  # time.monotonic() of the signal
    continued_at: float | None = None  # SIGCONT of a stopped worker
    whole_at: float | None = None  # the mesh whole again after it (see chaos.is_whole)


def plan_faults(seed: int, nodes: list[str], first_s: float, spacing_s: float, until_s: float) -> list[Fault]:
    """Every kind once per round, each round in a seeded order, spacing_s apart from first_s on, as many
    as fit before until_s; a worker fault picks one of nodes."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    at = first_s
    while True:
        kinds = list(KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            if at > until_s:
                return faults
            service = KINDS[kind][0]
            target = f"{service}:{rng.choice(nodes)}" if service in ("worker", "telemetry") else service
            faults.append(Fault(kind, target, round(at, 1)))
            at += spacing_s


def inject(fault: Fault, services: dict[str, int], now: float) -> None:
    """Send the fault's signal to its target's current pid; KeyError when the target is not running."""
    fault.pid = services[fault.target]
    os.kill(fault.pid, KINDS[fault.kind][1])
    fault.injected_at = now


def resume(fault: Fault, now: float) -> None:
    """SIGCONT a stopped worker (a no-op for other kinds, and for a process that is gone)."""
    if KINDS[fault.kind][1] is signal.SIGSTOP and fault.continued_at is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(fault.pid, signal.SIGCONT)
        fault.continued_at = now
