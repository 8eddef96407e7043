"""Drives one LLMEngine from one thread for bench/mixed.py: an open-loop trace (requests added when their
arrival time has passed: before each step, and between the layers of a running step, as AsyncLLM does),
or requests one at a time on an idle engine. Records when each request arrived, was added, first
scheduled, got each token and finished, and what every step did."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

from bench.mixed_trace import TraceRequest
from services.common.workload import WorkloadClass
from services.worker.engine import LLMEngine, SamplingParams
from services.worker.engine.errors import AdmissionError
from services.worker.engine.outputs import RequestOutput
from services.worker.engine.policy.classes import SchedulingHints
from services.worker.engine.scheduled_batch import ScheduledBatch
from services.worker.engine.step_interrupts import StepInterrupts

LATENCY = frozenset({WorkloadClass.REALTIME_CHAT, WorkloadClass.AGENT_TOOL})


@dataclass
class RequestTiming:
    """One request's life in time.monotonic() seconds. added is None when add_request refused it.

    token_times[i] is the end of the step that produced output token i; the first is the first token.
    """

    request: TraceRequest
    arrival: float
    added: float | None = None
    first_scheduled: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    refused: str | None = None  # AdmissionError text: queue full at add, or queue timeout later

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished is None or self.refused else self.finished - self.arrival


@dataclass(frozen=True)
class BatchShape:
    """What the scheduler put in one step, seen through the scheduler's observe_step hook.

    model_s: the runner's time for the step (what the policy's step-time model learns from); predicted_s:
    that model's estimate for this shape just before it learned from it (None before any step).
    """

    budget: int
    tokens: int
    seqs: int
    latency_seqs: int  # real-time and agent sequences
    latency_tokens: int
    model_s: float
    predicted_s: float | None


@dataclass(frozen=True)
class StepRecord:
    """One engine.step() that computed tokens: wall interval, its batch, queue sizes after it."""

    start: float
    end: float
    batch: BatchShape
    running: int
    waiting: int

    @property
    def budget(self) -> int:
        return self.batch.budget

    @property
    def tokens(self) -> int:
        return self.batch.tokens


@dataclass
class RunRecord:
    """One trace run: per-request timings in trace order, every step, the engine's counters for the run."""

    start: float  # monotonic time of trace offset 0
    end: float
    requests: list[RequestTiming]
    steps: list[StepRecord]
    preemptions_by_class: Counter[WorkloadClass]
    steps_by_budget: Counter[int]
    timed_out: bool  # the run hit its time cap and the unfinished requests were aborted


def _params(request: TraceRequest) -> SamplingParams:
    return SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=True)


def _hints(request: TraceRequest) -> SchedulingHints:
    return SchedulingHints(workload=request.workload, tenant=request.tenant)


def _add(engine: LLMEngine, timing: RequestTiming) -> None:
    request = timing.request
    try:
        # The trace's arrival, not this call: the engine's TTFT slack counts the wait for the step too.
        engine.add_request(
            request.request_id,
            request.prompt,
            _params(request),
            detokenize=False,
            hints=_hints(request),
            arrival_time=timing.arrival,
        )
    except AdmissionError as exc:
        timing.refused = str(exc)
        timing.finished = time.monotonic()
        return
    timing.added = time.monotonic()


def _record(outputs: list[RequestOutput], by_id: dict[str, RequestTiming], end: float) -> None:
    for out in outputs:
        timing = by_id[out.request_id]
        if timing.first_scheduled is None:
            timing.first_scheduled = out.first_scheduled_time
        timing.token_times.extend([end] * len(out.new_token_ids))
        if out.error is not None:
            timing.refused = str(out.error)
        if out.finished:
            timing.finished = end


def watch_batches(engine: LLMEngine) -> list[BatchShape]:
    """Wraps engine's scheduler.observe_step (on this instance only) to append every step's BatchShape to
    the returned list; the scheduler's behaviour is unchanged."""
    shapes: list[BatchShape] = []
    scheduler = engine.scheduler
    observe = scheduler.observe_step
    # The policy's step-time model, read for its predictions only; None if the policy no longer has one.
    model = getattr(getattr(scheduler.policy, "budget", None), "model", None)

    def watched(batch: ScheduledBatch, seconds: float) -> None:
        latency = [
            n for seq, n in zip(batch.seqs, batch.num_tokens, strict=True) if seq.hints.workload in LATENCY
        ]
        predicted = None if model is None else model.estimate(batch.total_tokens, len(batch.seqs))
        shape = BatchShape(
            batch.budget, batch.total_tokens, len(batch.seqs), len(latency), sum(latency), seconds, predicted
        )
        shapes.append(shape)
        observe(batch, seconds)

    scheduler.observe_step = watched  # type: ignore[method-assign]
    return shapes


def run_trace(engine: LLMEngine, trace: list[TraceRequest], max_s: float) -> RunRecord:
    """Run trace (sorted by arrival) open-loop on engine; after max_s seconds abort what is left."""
    shapes = watch_batches(engine)
    before_preempt = Counter(engine.stats.preemptions_by_class)
    before_budget = Counter(engine.stats.steps_by_budget)
    start = time.monotonic()
    timings = [RequestTiming(r, start + r.arrival_s) for r in trace]
    by_id = {t.request.request_id: t for t in timings}
    pending = deque(timings)
    steps: list[StepRecord] = []
    timed_out = False

    def add_arrived() -> None:
        now = time.monotonic()
        while pending and pending[0].arrival <= now:
            _add(engine, pending.popleft())

    # A policy without layer preemption never polls: arrivals then wait for the step to end, as before.
    interrupts = StepInterrupts(
        poll=add_arrived, deliver=lambda outputs: _record(outputs, by_id, time.monotonic())
    )
    while pending or engine.has_unfinished_requests():
        now = time.monotonic()
        if now - start > max_s:
            timed_out = True
            for timing in timings:
                if timing.finished is None and timing.added is not None:
                    engine.abort_request(timing.request.request_id)
            break
        add_arrived()
        if not engine.has_unfinished_requests():
            if pending:
                time.sleep(max(0.0, pending[0].arrival - time.monotonic()))
            continue
        observed = len(shapes)
        step_start = time.monotonic()
        outputs = engine.step(interrupts)
        step_end = time.monotonic()
        _record(outputs, by_id, step_end)
        if len(shapes) > observed:  # the step ran the model (not only refusals)
            scheduler = engine.scheduler
            steps.append(
                StepRecord(step_start, step_end, shapes[-1], scheduler.num_running, scheduler.num_waiting)
            )
    return RunRecord(
        start=start,
        end=time.monotonic(),
        requests=timings,
        steps=steps,
        preemptions_by_class=Counter(engine.stats.preemptions_by_class) - before_preempt,
        steps_by_budget=Counter(engine.stats.steps_by_budget) - before_budget,
        timed_out=timed_out,
    )


def run_idle(engine: LLMEngine, requests: list[TraceRequest]) -> list[RequestTiming]:
    """Each request alone on the idle engine, one after another; arrival = when it was added."""
    timings = []
    for request in requests:
        timing = RequestTiming(request, time.monotonic())
        _add(engine, timing)
        by_id = {request.request_id: timing}
        while timing.finished is None:
            outputs = engine.step()
            _record(outputs, by_id, time.monotonic())
        timings.append(timing)
    return timings


def warm_up(engine: LLMEngine, requests: list[TraceRequest]) -> None:
    """Run requests together to completion (kernels, allocator, and the policy's step-time model)."""
    for request in requests:
        engine.add_request(
            request.request_id, request.prompt, _params(request), detokenize=False, hints=_hints(request)
        )
    while engine.has_unfinished_requests():
        engine.step()


def batch_tok_s(engine: LLMEngine, docs: list[TraceRequest]) -> float:
    """Tokens (prompt + output) per second of docs all queued at once on engine and run to completion."""
    start = time.monotonic()
    warm_up(engine, docs)
    return sum(d.tokens for d in docs) / (time.monotonic() - start)
