"""bench/chaos.py's traffic and its checks: greedy completions over gRPC (Inference.Generate) and HTTP
(the OpenAI SDK, streamed), each judged against the reference output its prompt had before any fault.

Verdicts: completed (the reference exactly), failed_clean (a clear error status; whatever arrived before
it is a prefix of the reference), lost (no final status within the deadline), corrupted (any output that
differs from the reference where it should equal it). duplicated: tokens past max_tokens, which every
request asks for exactly (ignore_eos), so an extra one can only be a repeat.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field

import grpc
import openai

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc

MODEL = "smollm2"
PROMPTS = [
    f"{opening} {topic}"
    for opening, topic in itertools.product(
        ("Write one sentence about", "Explain briefly", "List three facts about", "Describe"),
        ("the sea.", "volcanoes.", "the moon.", "bread baking.", "old clocks."),
    )
]


@dataclass
class Outcome:
    """One request. sent / ended / first_token_at: time.monotonic(); status: OK, LOST, or the error."""

    transport: str
    prompt: int
    sent: float
    status: str = "LOST"
    ended: float | None = None
    first_token_at: float | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    node_id: str = ""
    usage_tokens: int | None = None


@dataclass(frozen=True)
class Reference:
    token_ids: tuple[int, ...]  # empty for HTTP, which carries text only
    text: str


@dataclass(frozen=True)
class Verdict:
    kind: str  # completed | failed_clean | lost | corrupted
    duplicated: int = 0
    before_tokens: bool = False  # failed_clean with nothing received: it should have moved on


def judge(outcome: Outcome, reference: Reference, max_tokens: int) -> Verdict:
    received = len(outcome.token_ids) if outcome.transport == "grpc" else (outcome.usage_tokens or 0)
    duplicated = max(0, received - max_tokens)
    if outcome.status == "LOST":
        return Verdict("lost", duplicated)
    if outcome.transport == "grpc":
        ids, want = tuple(outcome.token_ids), reference.token_ids
        exact = ids == want and outcome.text == reference.text
        prefix = want[: len(ids)] == ids and reference.text.startswith(outcome.text)
    else:
        exact = outcome.text == reference.text
        prefix = reference.text.startswith(outcome.text)
    if outcome.status == "OK":
        return Verdict("completed" if exact else "corrupted", duplicated)
    if not prefix:
        return Verdict("corrupted", duplicated)
    return Verdict("failed_clean", duplicated, before_tokens=outcome.first_token_at is None)


class Clients:
    """The gRPC stub and the OpenAI client on one mesh, with the request's shape fixed."""

    def __init__(
        self, gateway: str, openai_url: str, api_key: str, max_tokens: int, timeout_s: float
    ) -> None:
        self.channel = grpc.aio.insecure_channel(gateway)
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)
        self.http = openai.AsyncOpenAI(base_url=openai_url, api_key=api_key, max_retries=0, timeout=timeout_s)
        self.metadata = (("authorization", f"Bearer {api_key}"),)
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s

    async def close(self) -> None:
        await self.channel.close()
        await self.http.close()

    async def send(self, transport: str, prompt: int) -> Outcome:
        outcome = Outcome(transport, prompt, time.monotonic())
        send = self._grpc if transport == "grpc" else self._http
        try:
            # A hard stop a little past the deadline the request carries, in case nothing ends it.
            await asyncio.wait_for(send(outcome), self.timeout_s + 5.0)
        except TimeoutError:
            outcome.status = "LOST"
        return outcome

    async def _grpc(self, outcome: Outcome) -> None:
        sampling = inference_pb2.SamplingParams(temperature=0.0, max_tokens=self.max_tokens, ignore_eos=True)
        request = inference_pb2.GenerateRequest(
            model=MODEL, prompt=PROMPTS[outcome.prompt], sampling=sampling
        )
        try:
            async for response in self.stub.Generate(request, metadata=self.metadata, timeout=self.timeout_s):
                if response.token_ids and outcome.first_token_at is None:
                    outcome.first_token_at = time.monotonic()
                outcome.node_id = outcome.node_id or response.node_id
                outcome.token_ids += response.token_ids
                outcome.text += response.text
            outcome.status = "OK"
        except grpc.aio.AioRpcError as failed:
            code = failed.code()
            outcome.status = "LOST" if code == grpc.StatusCode.DEADLINE_EXCEEDED else code.name
        outcome.ended = time.monotonic()

    async def _http(self, outcome: Outcome) -> None:
        try:
            stream = await self.http.completions.create(
                model=MODEL, prompt=PROMPTS[outcome.prompt], max_tokens=self.max_tokens, temperature=0.0,
                stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            )  # fmt: skip
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    outcome.first_token_at = outcome.first_token_at or time.monotonic()
                    outcome.text += chunk.choices[0].text
                if chunk.usage is not None:
                    outcome.usage_tokens = chunk.usage.completion_tokens
            outcome.status = "OK"
        except openai.APITimeoutError:
            outcome.status = "LOST"
        except openai.APIStatusError as failed:
            outcome.status = "LOST" if failed.status_code == 504 else f"HTTP_{failed.status_code}"
        except openai.APIError as failed:  # an error event inside the stream, or the connection dropped
            outcome.status = f"HTTP_STREAM_{type(failed).__name__}"
        outcome.ended = time.monotonic()


async def references(clients: Clients, concurrency: int) -> dict[tuple[str, int], Reference]:
    """Every prompt's output on both transports, before any fault (several at once, as under load)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(transport: str, prompt: int) -> tuple[tuple[str, int], Reference]:
        async with gate:
            outcome = await clients.send(transport, prompt)
        if outcome.status != "OK":
            raise RuntimeError(f"reference {transport} #{prompt} failed before any fault: {outcome.status}")
        return (transport, prompt), Reference(tuple(outcome.token_ids), outcome.text)

    pairs = [(t, p) for t in ("grpc", "http") for p in range(len(PROMPTS))]
    return dict(await asyncio.gather(*(one(t, p) for t, p in pairs)))


async def closed_loop(clients: Clients, concurrency: int, until: float, seed: int) -> list[Outcome]:
    """concurrency callers, each sending its next request when the last ended, until time.monotonic()
    reaches until; even callers use gRPC, odd ones HTTP."""
    outcomes: list[Outcome] = []

    async def caller(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        transport = "grpc" if n % 2 == 0 else "http"
        while time.monotonic() < until:
            outcomes.append(await clients.send(transport, rng.randrange(len(PROMPTS))))

    await asyncio.gather(*(caller(n) for n in range(concurrency)))
    return outcomes
