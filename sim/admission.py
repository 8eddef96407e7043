"""The engine's admission and preemption, as the worker's adaptive policy does them
(services/worker/engine/scheduler.py; sim/engine_model.py's docstring says what is modelled): which
waiting prompt is admitted, which running sequence a better-ranked prompt or a full KV pool displaces,
and what a displaced one keeps.

The engine's state these read and write is declared here, as sim/residency.py declares its own, so that
the methods type-check on their own class and compile with sim/compiled.py."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from sim.prefix_cache import PrefixCache, usable_hit
from sim.request import Request
from sim.residency import ModelLifecycle

NO_VICTIM = 3  # above every class's priority: nothing was preempted at this event
DONE_TOLERANCE = 1e-6  # a sequence whose finish counter is this close to the counter is done


class Admission(ModelLifecycle):
    """GpuEngine's admission and preemption (sim/engine_model.py)."""

    counter: float
    running: list[tuple[float, int, Request]]
    num_waiting: int
    batch_running: int
    kv_prompts: int
    admits: int
    floor: int
    cache: PrefixCache
    prefix_hits: int
    prefix_tokens_saved: int
    preemptions: int
    recomputed_tokens: int
    on_refused: Callable[[Request], None] | None
    queue_timeouts: int

    @property
    def num_running(self) -> int:
        return len(self.running) + len(self.prefilling) + len(self.joining)

    def _head(self) -> Request | None:
        """The first waiting prompt in policy order; None when none waits."""
        if not self.num_waiting:
            return None
        return next(q for q in self.waiting if q)[0]

    def _admit(self, unserved: int, displace: bool) -> Request | None:
        """The first waiting prompt in policy order, admitted into prefilling[unserved] if it fits (with
        displace, after preempting lower-ranked sequences not served this step until it does); None
        if it must wait."""
        queue = next(q for q in self.waiting if q)
        request = queue[0]
        profile = self.profile
        tokens = request.prompt + request.generated  # a preempted request recomputes what it streamed
        batch = request.priority == 2
        need = tokens + min(max(request.output - request.generated, 0), profile.expected_output_tokens)
        reserve = profile.kv_watermark + (profile.latency_reserve if batch else 0.0)
        seats = profile.max_running - (int(profile.latency_reserve * profile.max_running) if batch else 0)
        while self.num_running and (
            self.num_running >= seats or need + reserve * self.kv_capacity > self.kv_capacity - self.kv_used
        ):
            # Only a worse class can be displaced: none below batch, and below agent only batch (a scan of
            # the running set at every step of a full GPU would cost more than the rest of the step).
            if not displace or batch or (request.priority == 1 and not self.batch_running):
                return None
            victim = self._victim(unserved)
            if victim is None or victim.priority <= request.priority:
                return None
            self._preempt(victim)
        cache = self.cache
        hit = cache.longest(request.conversation, request.tools)
        if hit:
            cache.touch(request.conversation, request.tools)  # attached first: eviction spares it
        queue.popleft()
        self.num_waiting -= 1
        self.batch_running += batch
        self.admits += 1
        request.admit_no = self.admits
        self.kv_prompts += tokens
        self.kv_used += tokens
        cache.make_room(int(self.kv_capacity - self.kv_used))
        if hit:
            self.prefix_hits += 1
        cached = usable_hit(hit, tokens, profile.block_tokens)
        request.to_prefill = tokens - cached
        self.prefix_tokens_saved += cached
        if request.generated:
            self.recomputed_tokens += request.to_prefill
        else:
            request.cached = cached  # of its prompt (a resumed request's hit also covers what it streamed)
        cache.remember(request.tools, request.tools_tokens, int(self.kv_capacity - self.kv_used))
        # Ranked after every admitted prompt of its class and better (they were admitted earlier).
        at = len(self.prefilling)
        while at > unserved and self.prefilling[at - 1].priority > request.priority:
            at -= 1
        self.prefilling.insert(at, request)
        return request

    def _queued(self, request: Request) -> None:
        """request joined its queue: what the prefix cache holds of it, for the heartbeat's latency
        prefill (the worker's WaitingCounts looks a latency sequence up as it joins; batch is not)."""
        if request.priority < 2:
            hit = self.cache.longest(request.conversation, request.tools)
            tokens = request.prompt + request.generated
            request.queued_cached = usable_hit(hit, tokens, self.profile.block_tokens)

    def _expire(self, now: float) -> None:
        """Refuse the waiting requests never scheduled by their queue timeout (the worker's scheduler,
        _expire) and hand each to on_refused. A preempted one already streamed tokens: it resumes, never
        refused. Each class's queue holds the preempted first, then the rest in arrival order, so the
        walk stops at the first of those not due (a class sharing a queue with one of a longer timeout
        may be refused a little late: the simulated workloads put none there)."""
        on_refused = self.on_refused
        assert on_refused is not None
        for queue in self.waiting:
            expired: list[Request] = []
            for request in queue:
                if request.admit_no:
                    continue
                if request.expires_s > now:
                    break
                expired.append(request)
            for request in expired:
                queue.remove(request)
                self.num_waiting -= 1
                self.queue_timeouts += 1
                on_refused(request)

    def _earliest_expiry(self) -> float:
        """When the next waiting request is refused if nothing schedules it first (as _expire walks)."""
        earliest = math.inf
        for queue in self.waiting:
            for request in queue:
                if request.admit_no:
                    continue
                earliest = min(earliest, request.expires_s)
                break
        return earliest

    def _victim(self, unserved: int) -> Request | None:
        """The lowest-ranked sequence not served this step (prefilling[unserved:] and the decodes): the
        worst class, the most recently admitted within it."""
        worst: Request | None = None
        for request in self.prefilling[unserved:]:
            if worst is None or (request.priority, request.admit_no) > (worst.priority, worst.admit_no):
                worst = request
        for _, _, request in self.running:
            if worst is None or (request.priority, request.admit_no) > (worst.priority, worst.admit_no):
                worst = request
        return worst

    def _relieve(self) -> None:
        """The pool cannot take the decodes' next tokens: preempt the lowest-ranked sequences until it
        can, never the last one (alone, a sequence always gets on)."""
        running = self.running
        while self.kv_capacity - self.kv_used < len(running) and len(running) + len(self.prefilling) > 1:
            victim = self._victim(0)
            assert victim is not None
            self._preempt(victim)

    def _preempt(self, request: Request) -> None:
        """Drop request's KV and queue it again at the head of its class, to recompute its prompt and what
        it streamed; its blocks stay in the prefix cache while nothing else needs them."""
        if request in self.prefilling:
            self.prefilling.remove(request)
            tokens = request.prompt + request.generated
            self.kv_prompts -= tokens
            held = tokens - request.to_prefill  # what its prompt steps computed so far
        else:
            self.running.remove((request.finish_counter, request.id, request))
            heapq.heapify(self.running)
            steps = self.counter - request.join_counter
            held = request.prompt + request.generated - 1 + int(steps + DONE_TOLERANCE)
            self.context[request.model] -= request.prompt + request.generated - 1 + steps
            self.rows[request.model] -= 1
            if not self.rows[request.model]:
                self.context[request.model] = 0.0
            request.generated += int(steps + DONE_TOLERANCE)
        self._sync_kv()
        self.batch_running -= request.priority == 2
        self.preemptions += 1
        request.preemptions += 1
        self.floor = min(self.floor, request.priority)
        self.waiting[request.priority].appendleft(request)
        self.num_waiting += 1
        self.cache.remember(request.conversation, held, int(self.kv_capacity - self.kv_used))
        self._queued(request)

    def _sync_kv(self) -> None:
        """kv_used from its parts (the fluid's increments drift by rounding)."""
        held = float(self.kv_prompts)
        for tokens in self.context.values():
            held += tokens
        self.kv_used = held
