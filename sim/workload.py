"""The four workload classes as sessions that arrive over time and issue requests one after another.

- Chat: ShareGPT V3 conversations (sim/sharegpt.py), each turn's prompt the whole history so far plus
  the new user message, its output the recorded reply; the next turn follows the reply after a human
  think time. The prompt's leading tokens, which the gateway hashes for the placer, are the
  conversation's own first message.
- Agent: tenants with a shared tool prompt (800-3000 tokens, the prefix the gateway hashes), each
  trajectory a few steps of short tool calls, every step's prompt growing by the call and its result.
- Batch: documents of a few jobs, each job's instruction prefix shared, long prompts and replies.
- Embedding: short inputs (ShareGPT user turns) for the encoder.

New sessions arrive as Poisson processes whose rate follows a compressed day (one sine period over the
run; batch runs in anti-phase, filling the valleys) and, for chat and embedding, seeded bursts at 1.6x.
Every draw comes from a generator seeded by (seed, class, session), so all policies see the same
sessions; only the follow-up arrival times depend on how fast the previous answer came back.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator

import numpy as np

from services.common.workload import WorkloadClass
from sim.config import Models, WorkloadConfig
from sim.request import Request, sim_prefix_ends
from sim.sharegpt import Conversation

CHAT_SYSTEM_TOKENS = 60
MAX_OUTPUT_TOKENS = 1024
_CLASSES = (
    WorkloadClass.REALTIME_CHAT,
    WorkloadClass.AGENT_TOOL,
    WorkloadClass.BATCH,
    WorkloadClass.EMBEDDING,
)


class Session:
    """One conversation, trajectory, document or embedding call: what it asks next."""

    __slots__ = (
        "history", "index", "key", "model", "prefix_chain", "rng", "sent", "tools", "tools_tokens", "turn",
        "turns", "workload", "zone",
    )  # fmt: skip
    history: int
    index: int
    key: int
    model: str
    prefix_chain: tuple[int, ...]
    rng: random.Random
    sent: int  # the previous turn's prompt tokens (0 before the first)
    tools: int
    tools_tokens: int
    turn: int
    turns: list[tuple[int, int]]
    workload: WorkloadClass
    zone: str


class Workload:
    def __init__(
        self,
        config: WorkloadConfig,
        gpus: int,
        zones: list[str],
        conversations: list[Conversation],
        seed: int,
        models: Models | None = None,
    ) -> None:
        """models: which model each class asks for (None: Models())."""
        self.config = config
        self.zones = zones
        self.conversations = conversations
        self.seed = seed
        self.models = models or Models()
        self.rates = {
            WorkloadClass.REALTIME_CHAT: config.chat_rate * gpus,
            WorkloadClass.AGENT_TOOL: config.agent_rate * gpus,
            WorkloadClass.BATCH: config.batch_rate * gpus,
            WorkloadClass.EMBEDDING: config.embedding_rate * gpus,
        }
        tenant_rng = np.random.default_rng([seed, 7])
        self.tool_tokens = tenant_rng.integers(800, 3001, config.agent_tenants)
        self.user_turns = [u for conv in conversations for u, _ in conv]
        self._bursts = self._burst_windows(random.Random(_key(seed, 8)))
        self._next_id = 0

    # --- arrivals -------------------------------------------------------------------------------------

    def arrivals(self) -> Iterator[Request]:
        """Every session's first request, in arrival order, until the run's duration."""
        heap: list[tuple[float, int, WorkloadClass, random.Random]] = []
        for order, workload in enumerate(_CLASSES):
            rng = random.Random(_key(self.seed, 2, int(workload)))
            heap.append((self._next_arrival(workload, 0.0, rng), order, workload, rng))
        heapq.heapify(heap)
        counts = dict.fromkeys(_CLASSES, 0)
        while heap:
            t, order, workload, rng = heapq.heappop(heap)
            if t >= self.config.duration_s:
                continue
            session = self._session(workload, counts[workload])
            counts[workload] += 1
            yield self._request(session, t)
            heapq.heappush(heap, (self._next_arrival(workload, t, rng), order, workload, rng))

    def follow_up(self, done: Request) -> Request | None:
        """The session's next request once `done` completed, or None when the session is over."""
        session = done.follow_up
        if not isinstance(session, Session) or session.turn >= len(session.turns):
            return None
        pause = (
            self.config.chat_think_s
            if session.workload == WorkloadClass.REALTIME_CHAT
            else self.config.agent_tool_s
        )
        t = done.done_s + session.rng.expovariate(1.0 / pause)
        return self._request(session, t) if t < self.config.duration_s else None

    def _next_arrival(self, workload: WorkloadClass, t: float, rng: random.Random) -> float:
        """Next arrival of a Poisson process with rate rates[workload] x modulation(t), by thinning."""
        peak = self.rates[workload] * (1 + self.config.diurnal_amplitude) * self.config.burst_factor
        if peak <= 0:
            return math.inf
        while True:
            t += rng.expovariate(peak)
            if t >= self.config.duration_s:
                return t
            if rng.random() * peak <= self.rates[workload] * self._modulation(workload, t):
                return t

    def _modulation(self, workload: WorkloadClass, t: float) -> float:
        phase = 2 * math.pi * t / self.config.duration_s - math.pi / 2  # a trough at the start
        if workload == WorkloadClass.BATCH:
            phase += math.pi
        level = 1 + self.config.diurnal_amplitude * math.sin(phase)
        if workload in (WorkloadClass.REALTIME_CHAT, WorkloadClass.EMBEDDING) and self._in_burst(t):
            level *= self.config.burst_factor
        return level

    def _burst_windows(self, rng: random.Random) -> list[tuple[float, float]]:
        windows: list[tuple[float, float]] = []
        t = 0.0
        while True:
            t += rng.expovariate(1.0 / self.config.burst_every_s)
            if t >= self.config.duration_s:
                return windows
            windows.append((t, t + self.config.burst_length_s))

    def _in_burst(self, t: float) -> bool:
        return any(start <= t < end for start, end in self._bursts)

    # --- sessions -------------------------------------------------------------------------------------

    def _session(self, workload: WorkloadClass, index: int) -> Session:
        s = Session()
        s.workload, s.index = workload, index
        # random.Random, not numpy: seeding one per session is ten times cheaper, and sessions are many.
        s.rng = random.Random(_key(self.seed, 3, int(workload), index))
        s.zone = self.zones[s.rng.randrange(len(self.zones))]
        s.turn, s.history, s.tools, s.tools_tokens, s.prefix_chain, s.sent = 0, 0, 0, 0, (), 0
        s.key = _key(self.seed, int(workload), index)
        if workload == WorkloadClass.REALTIME_CHAT:
            s.turns = self.conversations[s.rng.randrange(len(self.conversations))]
            # Its opening is its own (services/gateway/prefix_chain.py's chat_key); later turns extend it.
            s.history, s.model, s.prefix_chain = CHAT_SYSTEM_TOKENS, self.models.chat, (s.key,)
        elif workload == WorkloadClass.AGENT_TOOL:
            tenant = s.rng.randrange(self.config.agent_tenants)
            s.tools = _key(self.seed, 11, tenant)
            s.tools_tokens = int(self.tool_tokens[tenant])
            s.model = self.models.agent[tenant % len(self.models.agent)]
            # The tenant's tools (800-3,000 tokens: several whole blocks of the gateway's chain), then the
            # session's own task and history, which each later turn extends.
            s.prefix_chain, s.history = (s.tools, s.key), s.tools_tokens + 200
            steps = min(1 + int(s.rng.expovariate(1 / 5)), 20)  # about 6 steps on average
            s.turns = [(s.rng.randrange(100, 600), int(min(s.rng.lognormvariate(math.log(80), 0.5), 300)))
                       for _ in range(steps)]  # fmt: skip
        elif workload == WorkloadClass.BATCH:
            job = s.rng.randrange(self.config.batch_jobs)
            s.tools = _key(self.seed, 12, job)
            # The job's instruction, then a document no other request repeats.
            s.tools_tokens, s.model, s.prefix_chain = 300, self.models.batch, (s.tools,)
            document = int(min(s.rng.lognormvariate(math.log(self.config.batch_prompt_median), 0.6), 16000))
            reply = int(
                min(s.rng.lognormvariate(math.log(self.config.batch_output_median), 0.5), MAX_OUTPUT_TOKENS)
            )
            s.history, s.turns = 300, [(document, reply)]
        else:
            s.model = self.models.embedding
            s.turns = [(min(self.user_turns[s.rng.randrange(len(self.user_turns))], 512), 0)]
        return s

    def _request(self, s: Session, t: float) -> Request:
        user, reply = s.turns[s.turn]
        s.turn += 1
        prompt = s.history + user
        s.history = prompt + reply
        ends = sim_prefix_ends(s.prefix_chain, s.tools_tokens, s.sent)
        s.sent = prompt
        output = max(min(reply, MAX_OUTPUT_TOKENS), 0 if s.workload == WorkloadClass.EMBEDDING else 1)
        self._next_id += 1
        return Request(
            id=self._next_id,
            workload=s.workload,
            model=s.model,
            arrival_s=t,
            prompt=prompt,
            output=output,
            conversation=s.key if s.workload != WorkloadClass.EMBEDDING else 0,
            tools=s.tools,
            tools_tokens=s.tools_tokens,
            prefix_chain=s.prefix_chain,
            caller_zone=s.zone,
            follow_up=s,
            prefix_ends=ends,
        )


def _key(*parts: int) -> int:
    """A stable nonzero 63-bit key (hashes of int tuples do not vary between processes)."""
    return (hash(parts) & 0x7FFF_FFFF_FFFF_FFFF) or 1
