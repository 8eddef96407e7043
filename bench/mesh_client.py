"""The client side of bench/mesh.py: seeded requests, one timed stream, and a pass with N streams in flight.

The same code drives both paths; only the stub (Worker or Inference, same GenerateRequest) and the
metadata differ, so whatever the client costs is paid alike by the baseline and the gateway.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc, worker_pb2_grpc

Metadata = tuple[tuple[str, str], ...]
# Server-streaming Generate of either stub: (request, metadata=..., timeout=...) -> stream of responses.
GenerateFn = Callable[..., AsyncIterator[inference_pb2.GenerateResponse]]
FIRST_TOKEN_ID = 3  # ids 0-2 are <unk>, <s>, </s>; prompts use ordinary ids only
CALL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Timed:
    """One stream. ttft_s: call start to the first streamed message; e2e_s: call start to stream end."""

    ttft_s: float
    e2e_s: float
    token_ids: tuple[int, ...]


def make_requests(
    model: str,
    count: int,
    prompt_lens: Sequence[int],
    max_tokens: int,
    vocab_size: int,
    seed: int,
    workload: int,
) -> list[inference_pb2.GenerateRequest]:
    """count greedy, ignore_eos requests of max_tokens tokens; prompt lengths cycle through prompt_lens
    (tokens), ids drawn with `seed`, so every run sends the same requests. The class is explicit: the
    worker schedules by class, and a direct request would otherwise be scheduled as UNSPECIFIED while the
    gateway's copy is classified, so the two routes would not run the same work."""
    rng = random.Random(seed)
    requests = []
    for i in range(count):
        ids = [rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(prompt_lens[i % len(prompt_lens)])]
        requests.append(
            inference_pb2.GenerateRequest(
                model=model,
                workload_class=workload,
                prompt_token_ids=inference_pb2.TokenIds(ids=ids),
                sampling=inference_pb2.SamplingParams(
                    temperature=0.0, max_tokens=max_tokens, ignore_eos=True
                ),
            )
        )
    return requests


class Route:
    """One way to reach the model: a channel, its Generate method and the metadata it needs."""

    def __init__(self, name: str, address: str, via_gateway: bool, metadata: Metadata = ()) -> None:
        self.name = name
        self.metadata = metadata
        self.channel = grpc.aio.insecure_channel(address)
        stub = inference_pb2_grpc.InferenceStub if via_gateway else worker_pb2_grpc.WorkerStub
        self.generate: GenerateFn = stub(self.channel).Generate

    async def timed(self, request: inference_pb2.GenerateRequest) -> Timed:
        """Send one request and read its stream to the end; the AioRpcError of a failed call propagates."""
        started = time.perf_counter()
        first: float | None = None
        ids: list[int] = []
        async for response in self.generate(request, metadata=self.metadata, timeout=CALL_TIMEOUT_S):
            if first is None:
                first = time.perf_counter()
            ids.extend(response.token_ids)
        end = time.perf_counter()
        return Timed(ttft_s=(first or end) - started, e2e_s=end - started, token_ids=tuple(ids))

    async def close(self) -> None:
        await self.channel.close()


@dataclass(frozen=True)
class Pass:
    """A throughput pass: every request once, `in_flight` streams at a time; results in request order."""

    wall_s: float
    results: list[Timed]

    @property
    def tok_s(self) -> float:
        return sum(len(r.token_ids) for r in self.results) / self.wall_s


async def concurrent_pass(
    route: Route, requests: Sequence[inference_pb2.GenerateRequest], in_flight: int
) -> Pass:
    """in_flight client tasks pull the next request as soon as their stream ends (a closed loop), so
    exactly in_flight streams are open until the queue runs dry."""
    results: list[Timed | None] = [None] * len(requests)
    next_index = iter(range(len(requests)))

    async def client() -> None:
        for i in next_index:  # one shared iterator: each index is taken by exactly one task
            results[i] = await route.timed(requests[i])

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(in_flight)))
    wall = time.perf_counter() - started
    return Pass(wall_s=wall, results=[r for r in results if r is not None])
