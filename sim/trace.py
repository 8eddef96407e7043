"""One seeded trace from the simulator's own workload generator, fixed so that a real mesh and the
simulator can serve exactly the same requests.

sim/workload.py issues each session's next request once the previous one completed, after a think (or
tool) time drawn from the session's own generator, and stops issuing past the run's duration. Which
requests exist would then depend on how fast the server is. A trace fixes the set: it draws every
session and turn the workload would issue with answers that took no time (so a turn exists when its
session's start plus the think times before it lies within the duration), and keeps per turn the
tokens it adds to the conversation (the user message, tool result or document), its output length and
the think time after the previous turn's last token. Serving it, a turn is sent that think time after
the previous turn completed (as the workload does), so its prompt can carry the real previous turns,
and every session's first request arrives open loop at its start time.

Scaled to a small server: outputs are capped (max_output), a session ends before its first turn whose
prompt would exceed max_prompt, and embedding inputs are cut to the encoder's limit (as the worker
truncates them), so both sides see the same token counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from services.common.workload import WorkloadClass
from sim.config import Models, WorkloadConfig
from sim.request import Request, sim_prefix_ends
from sim.sharegpt import Conversation
from sim.workload import Workload


@dataclass(frozen=True)
class Turn:
    new_tokens: int  # tokens this turn appends after the previous turn's prompt and output
    output: int
    gap_s: float  # after the previous turn's last token (0 for the first turn)


@dataclass(frozen=True)
class TraceSession:
    """shared_key / shared_tokens: a prefix other sessions share (an agent tenant's tools, a batch job's
    instruction; 0 for none); conversation: this session's own prefix-cache key (0 for an embedding);
    prefix_chain: what the gateway sends the placer of its prompts (sim/workload.py's)."""

    index: int
    workload: WorkloadClass
    model: str
    start_s: float
    shared_key: int
    shared_tokens: int
    conversation: int
    prefix_chain: tuple[int, ...]
    zone: str
    turns: tuple[Turn, ...]

    def prompt(self, k: int) -> int:
        """Turn k's prompt tokens: the shared prefix, every earlier turn's tokens and outputs, its own."""
        before = self.turns[: k + 1]
        return self.shared_tokens + sum(t.new_tokens for t in before) + sum(t.output for t in before[:-1])


@dataclass(frozen=True)
class TraceLimits:
    max_output: int = 1024
    max_prompt: int = 1 << 30
    max_embedding_tokens: int = 1 << 30


@dataclass(frozen=True)
class Trace:
    duration_s: float
    sessions: tuple[TraceSession, ...]  # by start time

    def requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def totals(self) -> dict[WorkloadClass, tuple[int, int, int]]:
        """Per class: (requests, prompt tokens, output tokens)."""
        out: dict[WorkloadClass, tuple[int, int, int]] = {}
        for s in self.sessions:
            n, p, o = out.get(s.workload, (0, 0, 0))
            prompts = sum(s.prompt(k) for k in range(len(s.turns)))
            out[s.workload] = (n + len(s.turns), p + prompts, o + sum(t.output for t in s.turns))
        return out


def build_trace(
    config: WorkloadConfig,
    gpus: int,
    zones: list[str],
    conversations: list[Conversation],
    seed: int,
    models: Models,
    limits: TraceLimits = TraceLimits(),
) -> Trace:
    """Every session sim/workload.py would start within config.duration_s, with the turns it would
    issue if each answer took no time, scaled by limits."""
    workload = Workload(config, gpus, zones, conversations, seed, models)
    sessions = []
    for first in workload.arrivals():
        issued = [first]
        while True:
            issued[-1].done_s = issued[-1].arrival_s  # answered at once: only think times separate turns
            follow = workload.follow_up(issued[-1])
            if follow is None:
                break
            issued.append(follow)
        session = _session(len(sessions), issued, limits)
        if session is not None:
            sessions.append(session)
    return Trace(config.duration_s, tuple(sessions))


def _session(index: int, issued: list[Request], limits: TraceLimits) -> TraceSession | None:
    first = issued[0]
    embedding = first.workload == WorkloadClass.EMBEDDING
    shared = first.tools_tokens if first.tools else 0
    turns: list[Turn] = []
    prompt = shared
    previous: Request | None = None
    for request in issued:
        added = request.prompt - (shared if previous is None else previous.prompt + previous.output)
        output = 0 if embedding else min(request.output, limits.max_output)
        if embedding:
            added = min(added, limits.max_embedding_tokens)
        gap = 0.0 if previous is None else request.arrival_s - previous.arrival_s
        if prompt + added > limits.max_prompt:
            break
        turns.append(Turn(added, output, gap))
        prompt += added + output
        previous = request
    if not turns:
        return None
    return TraceSession(
        index=index,
        workload=first.workload,
        model=first.model,
        start_s=first.arrival_s,
        shared_key=first.tools,
        shared_tokens=shared,
        conversation=first.conversation,
        prefix_chain=first.prefix_chain,
        zone=first.caller_zone,
        turns=tuple(turns),
    )


class TraceWorkload:
    """A Trace served by sim/simulation.py in place of its Workload: first turns at their start times,
    each later turn its think time after the previous one completed. completed: every request done, in
    completion order (the simulation hands each one to follow_up)."""

    def __init__(self, trace: Trace, models: Models) -> None:
        self.trace = trace
        self.models = models
        self.completed: list[Request] = []

    def arrivals(self) -> Iterator[Request]:
        for session in self.trace.sessions:
            yield self.request(session, 0, session.start_s)

    def follow_up(self, done: Request) -> Request | None:
        self.completed.append(done)
        session, k = done.follow_up  # type: ignore[misc]
        if k + 1 >= len(session.turns):
            return None
        return self.request(session, k + 1, done.done_s + session.turns[k + 1].gap_s)

    @staticmethod
    def request(session: TraceSession, k: int, arrival_s: float) -> Request:
        return Request(
            id=session.index * 1000 + k,
            workload=session.workload,
            model=session.model,
            arrival_s=arrival_s,
            prompt=session.prompt(k),
            output=session.turns[k].output,
            conversation=session.conversation,
            tools=session.shared_key,
            tools_tokens=session.shared_tokens,
            prefix_chain=session.prefix_chain,
            caller_zone=session.zone,
            follow_up=(session, k),
            prefix_ends=sim_prefix_ends(
                session.prefix_chain, session.shared_tokens, session.prompt(k - 1) if k else 0
            ),
        )
