"""One GPU's continuous-batching engine, simulated at the granularity of events, not iterations.

Decodes advance as a fluid: between two events (an arrival, a prompt step's end, a sequence's last
token, the KV pool running out, a clock change) every running sequence gains one token per decode step,
and a step takes the profile's time for the batch as it stood at the last event; a counter of decode
steps tells when each sequence finishes, so a GPU costs nothing while it only decodes. Prompt work runs
in explicit steps (chunked prefill: the step's token budget less one token per running decode), so
time to first token is resolved to the step.

Admission and preemption follow the worker's adaptive policy (services/worker/engine/scheduler.py).
Sequences rank by class (chat, then the other latency classes, batch last), then by admission; waiting
prompts are taken in that order, head of line. A prompt is admitted when a seat is free and the pool
holds its KV plus its expected output (the policy's expected_output_tokens, or its whole output if
shorter) plus the watermark, and for batch also the latency reserve's share of KV and seats; a prompt
that does not fit takes the seat and KV of lower-ranked sequences (the lowest ranked, most recently
admitted first), which go back to the head of their class's queue to recompute what they held (their
blocks stay in the prefix cache while nothing else needs them, so that is cheap unless the pool is
tight). KV grows a token per decode; when the pool runs out, the lowest-ranked sequences are preempted
the same way. After a preemption only what outranks every victim is admitted at that step (no thrash).
A prompt never scheduled within its class's queue timeout (the worker's defaults: chat 5 s, agent 10 s,
batch 600 s) is refused at the first step boundary past it and handed back (on_refused), for the gateway
to try another worker.
A latency-class prompt that arrives during a decode step starts after at most the profile's preemption
granularity (layer-level preemption; half a layer of the running step where the profile knows the
layers), and during a prompt step it runs nested in a free seat and free KV, displacing nothing, unless
that step computes latency-class prompts it does not outrank (the worker's urgent step: chat interrupts
agent prompts, not another chat's); any other waits for the step to end.

What this costs in fidelity: a decode stretch keeps the step time of its start (context grows by a few
hundred tokens at most before the next event); several resident models share one timeline (their steps
run one after another, as on one GPU); KV is counted in tokens, not 16-token blocks; decodes always get
their token in a step, even where the real engine would give an outranking prompt their budget.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

from sim.admission import DONE_TOLERANCE, NO_VICTIM
from sim.encoder_path import DECODE, IDLE, STEP, EncoderPath
from sim.prefix_cache import PrefixCache, usable_hit
from sim.profiles import GpuProfile, ModelCost
from sim.request import QUEUE_TIMEOUT_S, Request
from sim.residency import Residency

_EPS = 1e-9
_INF = math.inf

Schedule = Callable[[float, "GpuEngine", int], None]


class GpuEngine(EncoderPath):
    """schedule(time, engine, version): asks the event loop to call on_event(time, version) then;
    on_done(request): a request's last token (or its embedding) is out. models: resident at the start;
    host_copies: others the worker can reload from host memory (sim/residency.py). on_refused(request):
    a prompt waited past its queue timeout and left the engine; None keeps every prompt however long it
    waits (an engine with no gateway to hand it to)."""

    def __init__(
        self,
        index: int,
        profile: GpuProfile,
        models: list[str],
        schedule: Schedule,
        on_done: Callable[[Request], None],
        host_copies: tuple[str, ...] = (),
        on_refused: Callable[[Request], None] | None = None,
    ) -> None:
        self.index = index
        self.profile = profile
        copies = [m for m in host_copies if m not in models]
        catalog = {m: profile.model(m) for m in (*models, *copies)}
        self.residency = Residency(catalog, profile.memory_bytes * 0.9, copies)
        self.last_used = self.residency.last_used
        self.costs: dict[str, ModelCost] = {m: catalog[m] for m in models}  # the resident models'
        self._size_kv()
        self._schedule = schedule
        self._on_done = on_done
        self.on_refused = on_refused
        self.queue_timeouts = 0  # prompts refused after their class's queue timeout
        self.clock = 1.0  # SM clock factor, set by the thermal model
        self.mode = IDLE
        self.t = 0.0  # time of the last advance
        self.counter = 0.0  # decode steps run so far (fractional inside a decode stretch)
        self.waiting: tuple[deque[Request], ...] = (deque(), deque(), deque())
        self.num_waiting = 0
        self.batch_running = 0  # admitted BATCH requests (prefilling or decoding)
        self.prefilling: list[Request] = []  # admitted, prompt not yet computed, in rank order
        self.running: list[tuple[float, int, Request]] = []  # decoding, a heap by finish counter
        self.rows: dict[str, int] = dict.fromkeys(self.costs, 0)  # decoding sequences per model
        self.context: dict[str, float] = dict.fromkeys(self.costs, 0.0)  # their context tokens (KV held)
        self.kv_prompts = 0  # KV of admitted sequences not decoding yet (what their prompt steps compute)
        self.kv_used = 0.0  # kv_prompts + the decodes' context, as of the last event
        self.admits = 0
        self.floor = NO_VICTIM  # the best-ranked class preempted at this event: only better ones come in
        self.cache = PrefixCache()
        self.step: list[tuple[Request, int]] = []
        self.joining: list[Request] = []  # first token out in a nested step; decoding from the step's end
        self.step_end = 0.0
        self.step_s = 0.0  # the running prompt step's duration
        self.decode_step_s = 0.0
        self.next_event = math.inf
        self.version = 0
        self.busy_decode_s = 0.0
        self.busy_prefill_s = 0.0
        self.prefix_hits = 0
        self.prefix_tokens_saved = 0
        self.prefill_compute_s = 0.0  # the prompt tokens' share of step time, at full clock
        self.decoded_tokens = 0
        self.preemptions = 0
        self.recomputed_tokens = 0  # prompt tokens computed again after preemptions (prefix hits excluded)

    # --- what the rest of the simulation calls ----------------------------------------------------------

    def serves(self, model: str) -> bool:
        """Resident and not loading (a worker answers NOT_FOUND for any other model)."""
        return model in self.costs

    def enqueue(self, request: Request, now: float) -> None:
        self.advance(now)
        request.gpu = self.index
        self.last_used[request.model] = now
        if self.costs[request.model].embedding:
            self._embed(request, now)
            return
        request.expires_s = now + QUEUE_TIMEOUT_S[request.workload]
        self.waiting[request.priority].append(request)
        self.num_waiting += 1
        self._queued(request)
        if self.mode == IDLE:
            self._at(now)
        elif self.mode == DECODE:
            # The running decode step ends at the next whole counter; layer-level preemption lets a
            # latency-class prompt in sooner.
            residual = (math.ceil(self.counter - _EPS) - self.counter) * self.decode_step_s
            if request.priority < 2:
                residual = min(residual, self._preempt_wait(self.decode_step_s))
            self._at(now + max(residual, 0.0))
        elif request.priority < 2:
            self._nest(request, now)

    def _nest(self, request: Request, now: float) -> None:
        """Layer-level preemption during a prompt step: a latency-class prompt that is next in policy
        order, fits and needs one step runs in a step of its own within the preemption granularity; the
        interrupted step ends that much later. It joins the decodes when the interrupted step ends."""
        if (
            any(self.waiting[p] for p in range(request.priority))
            or self.waiting[request.priority][0] is not request
        ):
            return
        # A step computing latency-class prompts is the worker's urgent step, which only a prompt that
        # outranks all of them interrupts (chat during agent prompts); one of their own class waits for
        # its end (LLMEngine._run_urgent).
        if any(r.priority <= request.priority for r, _ in self.step):
            return
        tokens = request.prompt + request.generated
        hit = self.cache.longest(request.conversation, request.tools)
        if tokens - usable_hit(hit, tokens, self.profile.block_tokens) > self.profile.token_budget:
            return
        if self._admit(len(self.prefilling), displace=False) is not request:  # no free seat or KV: it waits
            return
        self.prefilling.remove(request)
        cost = self.costs[request.model]
        prompt_s = cost.prompt_s(tokens - request.to_prefill, request.to_prefill)
        self.prefill_compute_s += prompt_s
        seconds = (cost.base_s + prompt_s) / self.clock
        request.to_prefill = 0
        self.step_end += seconds
        self._at(self.step_end, force=True)
        if self._prefilled(request, now + self._preempt_wait(self.step_s) + seconds):
            self.joining.append(request)

    def on_event(self, now: float, version: int) -> None:
        if version != self.version:
            return  # superseded by a later schedule
        self.next_event = _INF
        self.floor = NO_VICTIM
        self.advance(now)
        # Decodes grew into free blocks since the last event: the cached prefixes there are gone.
        self.cache.make_room(int(self.kv_capacity - self.kv_used))
        if self.mode == STEP:
            self._end_step(now)
        if self.running and self.running[0][0] <= self.counter + DONE_TOLERANCE:
            self._complete_finished(now)
        if self.running and self.kv_capacity - self.kv_used < len(self.running):
            self._relieve()
        if self.num_waiting and self.on_refused is not None:
            self._expire(now)
        if (self.prefilling or self.num_waiting) and self._start_step(now):
            return
        if self.running:
            self._plan_decode(now)
        else:
            self.mode = IDLE

    def set_clock(self, now: float, factor: float) -> None:
        """The clock changed (the thermal model's, or a shared host's share): what is in progress speeds
        up or slows down. In a decode stretch, a prompt waiting for the running step's end keeps that
        wake-up, rescaled: replanning the stretch alone would leave it waiting for the stretch's end."""
        if factor == self.clock:
            return
        self.advance(now)
        old, self.clock = self.clock, factor
        if self.mode == STEP:
            self.step_end = now + (self.step_end - now) * old / factor
            self._at(self.step_end, force=True)
        elif self.mode == DECODE:
            woken = self.next_event
            self._plan_decode(now)
            if self.num_waiting or self.prefilling:
                self._at(now + (woken - now) * old / factor)

    def advance(self, now: float) -> None:
        """Bring the counters to now."""
        elapsed = now - self.t
        if elapsed <= 0.0:
            return
        if self.mode == DECODE:
            steps = elapsed / self.decode_step_s
            self.counter += steps
            for model, rows in self.rows.items():
                if rows:
                    self.context[model] += rows * steps
            self.kv_used += len(self.running) * steps
            self.busy_decode_s += elapsed
        elif self.mode == STEP:
            self.busy_prefill_s += elapsed
        self.t = now

    def latency_prompt_tokens(self) -> int:
        """Prompt tokens of the latency classes not yet computed, queued (less what the prefix cache held
        of them as they joined, as the worker counts) or admitted: the heartbeat's figure
        (Scheduler.latency_prompt_tokens)."""
        queued = sum(r.prompt + r.generated - r.queued_cached for p in (0, 1) for r in self.waiting[p])
        return queued + sum(r.to_prefill for r in self.prefilling if r.priority < 2)

    def kv_usage(self) -> float:
        return min(self.kv_used / self.kv_capacity, 1.0) if self.kv_capacity else 1.0

    # --- internals ------------------------------------------------------------------------------------

    def _at(self, when: float, force: bool = False) -> None:
        if not force and when >= self.next_event:
            return
        self.version += 1
        self.next_event = when
        self._schedule(when, self, self.version)

    def _preempt_wait(self, step_s: float) -> float:
        """How long a latency-class prompt waits for the running step (step_s long) to reach a
        preemption point: half a layer of it where the profile knows the layers, else the profile's
        constant."""
        layers = self.profile.layers
        return self.profile.preempt_granularity_s if layers is None else step_s / (2 * layers)

    def _plan_decode(self, now: float) -> None:
        """Decode until the first sequence finishes or, where something could be preempted, the pool
        runs out."""
        self.mode = DECODE
        self.decode_step_s = self._decode_step_s() / self.clock
        steps = self.running[0][0] - self.counter
        decodes = len(self.running)
        if decodes * steps > self.kv_capacity - self.kv_used and decodes + len(self.prefilling) > 1:
            steps = (self.kv_capacity - self.kv_used) / decodes
        if self.num_waiting and self.on_refused is not None:
            # The worker looks at its queue when it schedules a step: the first step boundary past the
            # next queue timeout ends the stretch.
            due = (self._earliest_expiry() - now) / self.decode_step_s
            if due < steps:
                steps = min(steps, math.ceil(self.counter + due - _EPS) - self.counter)
        self._at(now + max(steps, 0.0) * self.decode_step_s, force=True)

    def _start_step(self, now: float) -> bool:
        """Start a prompt step now if any prompt can run; False when none can (no seat or KV room).

        The budget goes in rank order over the admitted prompts and the waiting heads: a head that
        outranks the next admitted prompt is admitted (displacing lower-ranked sequences if it must)
        and served first."""
        decodes = len(self.running)
        profile = self.profile
        # The adaptive budget only where the profile has one (_budget); else the whole budget, inline:
        # this runs at every prompt step of every GPU.
        adaptive = profile.itl_min_efficiency is not None
        budget = self._budget(decodes) if adaptive else profile.token_budget - decodes
        chunk: list[tuple[Request, int]] = []
        prefilling = self.prefilling
        served = 0  # prefilling[:served] are in the chunk
        head = self._head()
        while budget > 0:
            following = prefilling[served] if served < len(prefilling) else None
            if head is not None and (following is None or head.priority < following.priority):
                if head.priority >= self.floor or self._admit(served, displace=True) is None:
                    head = None  # head of line: nothing behind it goes first
                    continue
                following = head  # admitted into prefilling[served], ranked before the rest
                head = self._head()
            if following is None:
                break
            take = following.to_prefill if following.to_prefill < budget else budget
            chunk.append((following, take))
            budget -= take
            served += 1
        if not chunk:
            return False
        costs, context_of = self.costs, self.context
        seconds = 0.0
        active: set[str] = set()
        for model, rows in self.rows.items():
            if rows:
                cost = costs[model]
                seconds += cost.per_row_s * rows + cost.per_context_token_s * context_of[model]
                active.add(model)
        prompt_s = 0.0
        for request, tokens in chunk:
            cost = costs[request.model]
            prompt_s += cost.prompt_s(request.prompt + request.generated - request.to_prefill, tokens)
            active.add(request.model)
        self.prefill_compute_s += prompt_s
        seconds += prompt_s
        seconds += sum(costs[m].base_s for m in active)
        self.step = chunk
        self.mode = STEP
        self.step_s = step_s = seconds / self.clock
        self.step_end = step_end = now + step_s
        self.version += 1  # _at(step_end, force=True), inline
        self.next_event = step_end
        self._schedule(step_end, self, self.version)
        return True

    def _end_step(self, now: float) -> None:
        if self.running:
            self.counter += 1.0
            for model, rows in self.rows.items():
                if rows:
                    self.context[model] += rows
            self.kv_used += len(self.running)
        for request, tokens in self.step:
            request.to_prefill -= tokens
            if request.to_prefill > 0:
                continue
            self.prefilling.remove(request)
            if self._prefilled(request, now):
                self._join(request)
        for request in self.joining:
            self._join(request)
        self.step = []
        self.joining = []

    def _prefilled(self, request: Request, now: float) -> bool:
        """request's prompt is computed and a token comes out at now (its first, unless it resumes after
        a preemption); True when it has more to decode, else it is finished."""
        if request.first_token_s < 0.0:
            request.first_token_s = now
        request.generated += 1
        if request.generated < request.output:
            return True
        self.kv_prompts -= request.prompt + request.generated - 1
        self._sync_kv()
        self._finish(request, now)
        return False

    def _join(self, request: Request) -> None:
        """A request with a token out decodes from here on; its prompt's KV is now a decode's context."""
        request.join_counter = self.counter
        request.finish_counter = self.counter + request.output - request.generated
        heapq.heappush(self.running, (request.finish_counter, request.id, request))
        held = request.prompt + request.generated - 1
        self.kv_prompts -= held
        self.rows[request.model] += 1
        self.context[request.model] += held

    def _complete_finished(self, now: float) -> None:
        running = self.running
        while running and running[0][0] <= self.counter + DONE_TOLERANCE:
            _, _, request = heapq.heappop(running)
            self.rows[request.model] -= 1
            self.context[request.model] -= request.prompt + request.output - 1
            if not self.rows[request.model]:
                self.context[request.model] = 0.0  # no drift from fluid rounding
            request.generated = request.output
            self._sync_kv()
            self._finish(request, now)

    def _finish(self, request: Request, now: float) -> None:
        """request is done and its KV already released."""
        request.done_s = now
        self.batch_running -= request.priority == 2
        self.decoded_tokens += request.output
        room = int(self.kv_capacity - self.kv_used)
        self.cache.remember(request.conversation, request.prompt + request.output, room)
        self._on_done(request)
