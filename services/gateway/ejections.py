"""Passive health checking, as Envoy's outlier detection does it: a worker whose link to this gateway
broke (it died, or hung and stopped answering keepalive pings) is left out of this gateway's picks for
eject_s, without waiting for the placer's view to drop it (about three heartbeat intervals after its last
beat, and a hung worker's last beat may still be fresh). After eject_s it is offered again: a worker that
was restarted, or continued, takes traffic without anyone clearing anything.

As Envoy's panic threshold does, ejections yield when they would leave no worker at all (see
Upstream.pick): trying a suspect worker beats refusing every request."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from prometheus_client import Counter

log = logging.getLogger(__name__)


class Ejections:
    def __init__(
        self, eject_s: float, counter: Counter | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.eject_s = eject_s
        self.counter = counter
        self.clock = clock
        self._until: dict[str, float] = {}  # node id -> when it is offered again

    def eject(self, node_id: str, why: str) -> None:
        """Leave node_id out of picks for eject_s from now (0: ejection is off)."""
        if self.eject_s <= 0:
            return
        if node_id not in self.active():
            log.warning("worker %s left out of picks for %.1f s: %s", node_id, self.eject_s, why)
            if self.counter is not None:
                self.counter.inc()
        self._until[node_id] = self.clock() + self.eject_s

    def active(self) -> list[str]:
        """The nodes left out now; expired ones are forgotten, so the dict never outgrows the fleet."""
        if not self._until:
            return []
        now = self.clock()
        for node_id in [n for n, until in self._until.items() if until <= now]:
            del self._until[node_id]
        return list(self._until)
