"""What each simulated worker does with its models, as services/worker/server does it.

- A heartbeat reply's directives (heartbeat.py `_follow`): each model to load that is in the catalog and
  not resident, one after another, then each model to evict that has nothing in flight. The heartbeat
  loop awaits the loads, so the GPU stops reporting until they are done (a load longer than the node TTL
  drops it from the placer's view), and a load that does not fit even after evicting idle models ends
  the reply's handling, as its exception does.
- A request for a model evicted with its weights kept on the host (servicer.py, `reload_if_evicted`):
  reloaded first; the request is served once it is resident. One that cannot fit is refused
  (RESOURCE_EXHAUSTED), and the gateway tries another node; one found not to fit only after waiting
  on another load is counted rejected (the gateway's retry then is not modelled; rare).
- One load at a time (the host's lock): whatever arrives during a load waits for it, in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sim.engine_model import GpuEngine
from sim.request import Request

ScheduleEnd = Callable[[float, int], None]  # (when, gpu): the running load ends then


@dataclass
class _Reply:
    loads: list[str]
    evicts: list[str]


@dataclass
class _Worker:
    waiting: deque[_Reply | Request] = field(default_factory=deque)  # behind the running load
    reply: _Reply | None = None  # the directive the running load belongs to, if any


class WorkerLoads:
    def __init__(
        self, engines: list[GpuEngine], paused: np.ndarray, moved: set[int], schedule_end: ScheduleEnd
    ) -> None:
        """paused: the feed's per-GPU flag that stops a GPU's heartbeats; moved: the feed's set of GPUs
        whose next heartbeat must report their models (Feed.moved)."""
        self.engines = engines
        self.paused = paused
        self.moved = moved
        self.schedule_end = schedule_end
        self._workers: dict[int, _Worker] = {}  # the GPUs with a load running
        self.refused: list[Request] = []  # waited on a load, then found no room (load_done's caller drains)
        self.loads_from_host = self.loads_from_disk = self.failed_loads = 0
        self.reloads_for_requests = 0
        self.load_s = 0.0

    def reply(self, g: int, now: float, loads: list[str], evicts: list[str]) -> None:
        worker = self._workers.get(g)
        if worker is not None:  # a load is running: this reply waits on the lock
            worker.waiting.append(_Reply(loads, evicts))
        else:
            self._carry_out(g, now, _Reply(loads, evicts))

    def request(self, g: int, now: float, request: Request) -> bool:
        """A request for a model g holds as a host copy: True if it will be served once reloaded (it waits
        here until then), False if the reload cannot fit (RESOURCE_EXHAUSTED)."""
        worker = self._workers.get(g)
        if worker is not None:
            worker.waiting.append(request)
            return True
        if not self._load(g, now, request.model):
            return False
        self.reloads_for_requests += 1
        self._workers[g].waiting.append(request)
        return True

    def load_done(self, g: int, now: float) -> list[Request]:
        """The running load on g ended: what waited on it, carried out in order; the requests now
        servable, for the caller to enqueue (refused ones are dropped: the caller counts them)."""
        worker = self._workers.pop(g)
        self.paused[g] = False
        self.engines[g].finish_load(now)
        self.moved.add(g)
        ready: list[Request] = []
        pending: deque[_Reply | Request] = worker.waiting
        if worker.reply is not None:
            pending.appendleft(worker.reply)
        while pending:
            item = pending.popleft()
            if isinstance(item, _Reply):
                self._carry_out(g, now, item)
            elif self.engines[g].serves(item.model):
                ready.append(item)
                continue
            elif item.model in self.engines[g].residency.host_copies and self._load(g, now, item.model):
                self.reloads_for_requests += 1
                self._workers[g].waiting.append(item)
            else:
                self.refused.append(item)
            if g in self._workers:  # a load started: the rest waits behind it
                self._workers[g].waiting.extend(pending)
                break
        return ready

    def _carry_out(self, g: int, now: float, reply: _Reply) -> None:
        engine = self.engines[g]
        while reply.loads:
            model = reply.loads.pop(0)
            if model not in engine.residency.catalog or engine.serves(model):
                continue
            if not self._load(g, now, model):
                return  # the load's exception ends the reply's handling
            self._workers[g].reply = reply
            self.paused[g] = True  # the heartbeat loop awaits the directive's loads
            return
        for model in reply.evicts:
            if engine.evict(model):
                self.moved.add(g)

    def _load(self, g: int, now: float, model: str) -> bool:
        engine = self.engines[g]
        from_host = model in engine.residency.host_copies
        seconds = engine.start_load(model)
        if seconds is None:
            self.failed_loads += 1
            return False
        self.moved.add(g)  # evicted to make room, if anything (the loading model still a host copy)
        self.loads_from_host += from_host
        self.loads_from_disk += not from_host
        self.load_s += seconds
        self._workers[g] = _Worker()
        self.schedule_end(now + seconds, g)
        return True

    def summary(self) -> dict[str, object]:
        return {
            "loads_from_host_copy": self.loads_from_host,
            "loads_from_disk": self.loads_from_disk,
            "reloads_for_requests": self.reloads_for_requests,
            "failed_loads": self.failed_loads,
            "evictions": sum(e.residency.evictions for e in self.engines),
            "load_s": self.load_s,
        }
