"""Restarts for the local stack's services, the way docker-compose's `restart: on-failure` or systemd's
`Restart=on-failure` with a growing `RestartSec` keep a service up: a service that exits unexpectedly is
started again after a delay that begins under a second and doubles to a cap, while the others keep
serving. One that keeps crashing (max_restarts within window_s) is reported and left down rather than
retried forever in silence. A run that lasted stable_after_s starts the backoff over.

A restarted service binds the ports it had (see ChildProcess.respawn), so the services holding its
address (every worker and the gateway hold the placer's) reach it again without being told.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from services.mesh.process import ServiceStartError


class Supervised(Protocol):
    """What a supervised service offers: a ChildProcess, or the stack's Redis (redis_service.py)."""

    name: str
    module: str
    ready_prefix: str
    log_path: Path
    started_at: float
    ready: dict[str, str]

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def check_ready(self) -> bool: ...

    def respawn(self, keep_ports: Mapping[str, str]) -> Supervised: ...

    def kill(self) -> int: ...


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    max_restarts: int = 5
    window_s: float = 120.0
    stable_after_s: float = 60.0

    def delay_s(self, attempt: int) -> float:
        """The wait before restart number attempt (1, 2, ...): first_delay_s, doubled each time, capped."""
        return min(self.max_delay_s, self.first_delay_s * 2 ** (attempt - 1))


@dataclass
class _Record:
    """One service's restart history."""

    restarts: list[float] = field(default_factory=list)  # monotonic times of the restarts made
    attempt: int = 0  # restarts since the last stable run
    due: float | None = None  # when the pending restart is to be made
    given_up: bool = False


class Supervisor:
    """Watches the children of tiers (lists it shares with the stack and updates in place: a restarted
    service replaces its dead process there, so stopping the stack stops the new one). Call tick()
    every fraction of a second; it never blocks on a service's start."""

    def __init__(
        self,
        tiers: list[list[Supervised]],
        keep_ports: Mapping[str, Mapping[str, str]],
        policy: RestartPolicy | None = None,
        say: Callable[[str], None] = print,
        ready_timeout_s: float = 180.0,
    ) -> None:
        """keep_ports: per service module, the env vars whose bound port a restart keeps (see
        ChildProcess.respawn). A restarted service not ready within ready_timeout_s is killed, which
        counts as another crash."""
        self.ready_timeout_s = ready_timeout_s
        self.tiers = tiers
        self.keep_ports = keep_ports
        self.policy = policy or RestartPolicy()
        self.say = say
        self.records: dict[str, _Record] = {}
        self._starting: dict[str, Supervised] = {}  # restarted, not yet ready

    @property
    def restarts(self) -> dict[str, int]:
        """Restarts made so far, by service name."""
        return {name: len(r.restarts) for name, r in self.records.items() if r.restarts}

    @property
    def given_up(self) -> list[str]:
        return [name for name, r in self.records.items() if r.given_up]

    def tick(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for tier in self.tiers:
            for index, child in enumerate(tier):
                self._watch(tier, index, child, now)

    def _watch(self, tier: list[Supervised], index: int, child: Supervised, now: float) -> None:
        record = self.records.setdefault(child.name, _Record())
        if record.given_up:
            return
        if child.name in self._starting:
            self._check_started(child, record, now)
            return
        code = child.poll()
        if code is None:
            if record.attempt and now - child.started_at >= self.policy.stable_after_s:
                record.attempt = 0  # it has run long enough: the next crash starts the backoff over
            return
        if record.due is None:
            self._schedule(child, record, code, now)
        elif now >= record.due:
            self._restart(tier, index, child, record, now)

    def _schedule(self, child: Supervised, record: _Record, code: int, now: float) -> None:
        p = self.policy
        recent = [t for t in record.restarts if now - t < p.window_s]
        if len(recent) >= p.max_restarts:
            record.given_up = True
            self.say(
                f"error: {child.name} exited with {code} after {len(recent)} restarts in {p.window_s:g} s; "
                f"not restarting it (see {child.log_path})"
            )
            return
        record.attempt += 1
        record.due = now + p.delay_s(record.attempt)
        self.say(f"{child.name} exited with {code}; restarting in {p.delay_s(record.attempt):.1f} s")

    def _restart(
        self, tier: list[Supervised], index: int, child: Supervised, record: _Record, now: float
    ) -> None:
        fresh = child.respawn(self.keep_ports.get(child.module, {}))
        tier[index] = fresh
        record.due = None
        record.restarts.append(now)
        self._starting[fresh.name] = fresh

    def _check_started(self, child: Supervised, record: _Record, now: float) -> None:
        try:
            ready = child.check_ready()
        except ServiceStartError:
            del self._starting[child.name]  # it died starting: poll() sees it and schedules the next try
            return
        if ready:
            del self._starting[child.name]
            self.say(f"{child.name} is back (pid {child.pid}, restart {len(record.restarts)})")
        elif now - child.started_at > self.ready_timeout_s:
            self.say(f"{child.name} printed no {child.ready_prefix} line within {self.ready_timeout_s:g} s")
            child.kill()  # poll() now sees it exited: the next tick schedules another try
