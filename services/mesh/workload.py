"""The demo's seeded request mix: which class, when it arrives, what it asks (no I/O, no generated code).

Requests are what each class looks like from a real client of a chat model: chats are short questions
sent as Inference.Chat (some with a system message, some a second turn), agent calls are chats that
offer functions, batch documents are summaries of a long text that run to their full length, and
embeddings are sentence lists. One fixed probe, a greedy question with a known answer, shows that the
model behind the mesh answers correctly and not only that tokens flow.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common.workload import WorkloadClass
from services.mesh.models import CHAT_MODEL, EMBED_MODEL
from services.mesh.workload_text import (
    AGENT_TASKS,
    DOCUMENT_SENTENCES,
    FOLLOW_UPS,
    QUESTIONS,
    SYSTEM_PROMPTS,
    TENANTS,
    TOOLS,
)

# Share of requests per class: mostly interactive traffic, with batch documents and embeddings mixed in.
DEFAULT_MIX: Mapping[WorkloadClass, float] = {
    WorkloadClass.REALTIME_CHAT: 0.40,
    WorkloadClass.AGENT_TOOL: 0.25,
    WorkloadClass.BATCH: 0.15,
    WorkloadClass.EMBEDDING: 0.20,
}

# The probe: greedy, so its answer is the same every run; SmolLM2 says "The capital of France is Paris."
PROBE_QUESTION = "What is the capital of France?"
PROBE_EXPECT = "Paris"
PROBE_MAX_TOKENS = 16


@dataclass(frozen=True)
class Tool:
    """A function offered to the model, as Inference's Tool: parameters_json is a JSON Schema's text."""

    name: str
    description: str
    parameters_json: str


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the demo. arrival_s: seconds after the workload starts. Which RPC it is follows
    from what it carries: messages ((role, content) pairs, with tools for agent calls) -> Chat, texts ->
    Embed, else prompt -> Generate. declare_class: send workload_class in the request (False: the
    gateway classifies it: a chat offering tools as an agent call, others by its heuristics). expect:
    text the answer must contain (the probe's), empty for no check."""

    index: int
    workload_class: WorkloadClass
    arrival_s: float
    model: str
    prompt: str = ""
    max_tokens: int = 0
    texts: tuple[str, ...] = ()
    declare_class: bool = False
    temperature: float = 0.0
    ignore_eos: bool = False
    seed: int = 0
    messages: tuple[tuple[str, str], ...] = ()
    tools: tuple[Tool, ...] = ()
    tenant: str = ""
    expect: str = ""

    @property
    def rpc(self) -> str:
        """ "Chat", "Embed" or "Generate": the Inference method that sends it."""
        return "Chat" if self.messages else "Embed" if self.texts else "Generate"

    @property
    def asked(self) -> str:
        """What the request asks, for a reader: the last message, the prompt, or the first text."""
        if self.messages:
            return self.messages[-1][1]
        return self.prompt or (self.texts[0] if self.texts else "")


def class_counts(n: int, mix: Mapping[WorkloadClass, float] = DEFAULT_MIX) -> dict[WorkloadClass, int]:
    """Split n requests by mix (largest remainder); every class gets at least one when n >= len(mix)."""
    total = sum(mix.values())
    exact = {c: n * w / total for c, w in mix.items()}
    counts = {c: int(x) for c, x in exact.items()}
    for c in sorted(mix, key=lambda c: exact[c] - counts[c], reverse=True)[: n - sum(counts.values())]:
        counts[c] += 1
    if n >= len(mix):
        for c in mix:  # a tiny run still exercises every class: take one from the largest
            if counts[c] == 0:
                counts[max(counts, key=lambda k: counts[k])] -= 1
                counts[c] = 1
    return counts


def plan_workload(n: int, seed: int, rate_rps: float = 6.0) -> list[PlannedRequest]:
    """n requests in arrival order, Poisson arrivals at rate_rps; the same (n, seed, rate) gives the same
    plan. The first chat is the probe (chat always has the largest share, so every plan has one)."""
    if n < 1 or rate_rps <= 0:
        raise ValueError(f"need n >= 1 and rate_rps > 0, got n={n}, rate_rps={rate_rps}")
    rng = random.Random(seed)
    classes = [c for c, k in class_counts(n).items() for _ in range(k)]
    rng.shuffle(classes)
    plan, t, probed = [], 0.0, False
    for i, cls in enumerate(classes):
        t += rng.expovariate(rate_rps)
        request = _request(rng, i, cls, round(t, 4))
        if cls is WorkloadClass.REALTIME_CHAT and not probed:
            # The probe takes the first chat's place and arrival (that chat's draws are still made), so
            # the class mix, the arrivals and every other request are as they would be without it.
            request, probed = probe(i, request.arrival_s), True
        plan.append(request)
    return plan


def probe(index: int, arrival_s: float) -> PlannedRequest:
    """The fixed greedy question whose answer must contain PROBE_EXPECT."""
    chat = WorkloadClass.REALTIME_CHAT
    messages = (("user", PROBE_QUESTION),)
    return PlannedRequest(
        index, chat, arrival_s, CHAT_MODEL, max_tokens=PROBE_MAX_TOKENS, declare_class=True,
        messages=messages, tenant=TENANTS[0], expect=PROBE_EXPECT,
    )  # fmt: skip


def _request(rng: random.Random, i: int, cls: WorkloadClass, t: float) -> PlannedRequest:
    seed = rng.randrange(2**31)
    tenant = rng.choice(TENANTS)
    if cls is WorkloadClass.REALTIME_CHAT:
        return PlannedRequest(
            i, cls, t, CHAT_MODEL, max_tokens=rng.randint(16, 32), temperature=0.7, seed=seed,
            # Half the chats leave the class unset, so the gateway's own classifier is exercised too.
            declare_class=rng.random() < 0.5, messages=_conversation(rng), tenant=tenant,
        )  # fmt: skip
    if cls is WorkloadClass.AGENT_TOOL:
        task, tool = rng.choice(AGENT_TASKS)
        # The tool the task needs plus one it does not: the model has to choose. Left unclassified, so
        # the gateway has to tell it is an agent call from the tools alone.
        other = rng.choice([name for name in TOOLS if name != tool])
        tools = tuple(_tool(name) for name in sorted({tool, other}))
        return PlannedRequest(
            i, cls, t, CHAT_MODEL, max_tokens=rng.randint(24, 32), temperature=0.7, seed=seed,
            messages=(("user", task),), tools=tools, tenant=tenant,
        )  # fmt: skip
    if cls is WorkloadClass.BATCH:
        doc = " ".join(rng.choice(DOCUMENT_SENTENCES) for _ in range(rng.randint(5, 10)))
        # ignore_eos: a batch job's cost is its full length, not wherever the summary happens to stop.
        kw: dict[str, Any] = {"max_tokens": rng.randint(48, 64), "declare_class": True, "ignore_eos": True}
        kw |= {"temperature": 0.7, "seed": seed, "tenant": tenant}
        if rng.random() < 0.5:  # both public routes carry documents: Chat and raw-text Generate
            messages = (("user", f"Summarize this document:\n\n{doc}"),)
            return PlannedRequest(i, cls, t, CHAT_MODEL, messages=messages, **kw)
        prompt = f"Summarize the following document.\n\n{doc}\n\nSummary:"
        return PlannedRequest(i, cls, t, CHAT_MODEL, prompt=prompt, **kw)
    texts = tuple(rng.choice(DOCUMENT_SENTENCES) for _ in range(rng.randint(2, 6)))
    return PlannedRequest(i, cls, t, EMBED_MODEL, texts=texts, seed=seed, tenant=tenant)


def _conversation(rng: random.Random) -> tuple[tuple[str, str], ...]:
    """A question alone, after a system message, or as the second turn of a short exchange."""
    kind = rng.random()
    if kind < 0.25:
        first, answer, follow_up = rng.choice(FOLLOW_UPS)
        return (("user", first), ("assistant", answer), ("user", follow_up))
    question = rng.choice(QUESTIONS)
    if kind < 0.5:
        return (("system", rng.choice(SYSTEM_PROMPTS)), ("user", question))
    return (("user", question),)


def _tool(name: str) -> Tool:
    description, params = TOOLS[name]
    schema = {
        "type": "object",
        "properties": {p: {"type": "string", "description": d} for p, d in params.items()},
        "required": list(params),
    }
    return Tool(name, description, json.dumps(schema, sort_keys=True))
