"""The demo's seeded request mix: which class, when it arrives, what it asks (no I/O, no generated code)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from services.common.workload import WorkloadClass
from services.mesh.models import BATCH_MODEL, CHAT_MODEL, EMBED_MODEL

# Share of requests per class: mostly interactive traffic, with batch documents and embeddings mixed in.
DEFAULT_MIX: Mapping[WorkloadClass, float] = {
    WorkloadClass.REALTIME_CHAT: 0.40,
    WorkloadClass.AGENT_TOOL: 0.25,
    WorkloadClass.BATCH: 0.15,
    WorkloadClass.EMBEDDING: 0.20,
}

_TOPICS = ["the sea", "a small town", "boiling water", "the library budget", "fishing boats", "sand castles"]
_ASKS = ["Tell me about", "Write two lines on", "What do you know about", "Say something kind about"]
_TOOLS = ["search(query)", "get_weather(city)", "read_file(path)", "send_email(to, body)"]
_TASKS = [
    "find the bridge repair cost",
    "check the weather by the coast",
    "open notes.txt",
    "email the committee",
]
_SENTENCES = [
    "The committee met to discuss the budget for the coming year.",
    "Several members argued that the library needed new books.",
    "Others wanted to repair the old bridge over the river.",
    "After a long debate they agreed to do both.",
    "The people of the town went fishing every morning.",
    "The children played on the beach and built castles of sand.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The boiling point falls as you climb, because the air pressure is lower.",
    "A serving engine batches requests so that the GPU stays busy.",
    "When memory runs short, the scheduler pauses the least urgent request.",
]


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the demo. arrival_s: seconds after the workload starts. Generate requests use
    prompt/max_tokens; embeddings use texts. declare_class: send workload_class in the request (False:
    the gateway classifies it, from metadata for agent calls or by its heuristics for chat)."""

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


def plan_workload(
    n: int, seed: int, rate_rps: float = 6.0, batch_model: str = BATCH_MODEL
) -> list[PlannedRequest]:
    """n requests in arrival order, Poisson arrivals at rate_rps; the same (n, seed, rate) gives the same
    plan. batch_model: the decoder batch documents go to (CHAT_MODEL when no worker holds the larger)."""
    if n < 1 or rate_rps <= 0:
        raise ValueError(f"need n >= 1 and rate_rps > 0, got n={n}, rate_rps={rate_rps}")
    rng = random.Random(seed)
    classes = [c for c, k in class_counts(n).items() for _ in range(k)]
    rng.shuffle(classes)
    plan, t = [], 0.0
    for i, cls in enumerate(classes):
        t += rng.expovariate(rate_rps)
        plan.append(_request(rng, i, cls, round(t, 4), batch_model))
    return plan


def _request(rng: random.Random, i: int, cls: WorkloadClass, t: float, batch_model: str) -> PlannedRequest:
    seed = rng.randrange(2**31)
    if cls is WorkloadClass.REALTIME_CHAT:
        prompt = f"{rng.choice(_ASKS)} {rng.choice(_TOPICS)}."
        # Half the chats leave the class unset, so the gateway's own classifier is exercised too.
        return PlannedRequest(
            i, cls, t, CHAT_MODEL, prompt, rng.randint(16, 32), declare_class=rng.random() < 0.5,
            temperature=0.8, seed=seed,
        )  # fmt: skip
    if cls is WorkloadClass.AGENT_TOOL:
        tools = ", ".join(rng.sample(_TOOLS, 2))
        prompt = f"Tools: {tools}. Task: {rng.choice(_TASKS)}. Reply with one JSON tool call:"
        return PlannedRequest(i, cls, t, CHAT_MODEL, prompt, rng.randint(8, 16), seed=seed)
    if cls is WorkloadClass.BATCH:
        doc = " ".join(rng.choice(_SENTENCES) for _ in range(rng.randint(8, 16)))
        prompt = f"Summarize the following document.\n\n{doc}\n\nSummary:"
        # ignore_eos: a batch job's cost is its full length; a random model's early EOS would hide it.
        return PlannedRequest(
            i, cls, t, batch_model, prompt, rng.randint(48, 96), declare_class=True, ignore_eos=True,
            temperature=0.8, seed=seed,
        )  # fmt: skip
    texts = tuple(rng.choice(_SENTENCES) for _ in range(rng.randint(2, 6)))
    return PlannedRequest(i, cls, t, EMBED_MODEL, texts=texts, seed=seed)
