"""The client side of bench/multimodel_serving.py: seeded Generate and Embed calls, and one pass that runs a
closed loop per model, all models at once, against whichever worker serves each.

The same requests, the same loops and one channel (one TCP connection) per model in either configuration,
so the client costs both alike; only where the models live differs."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import grpc

from bench.mesh_client import make_requests
from hanzo.inference.v1 import common_pb2, inference_pb2, worker_pb2_grpc

CALL_TIMEOUT_S = 120.0
# Embed inputs are text: sentences of these space-separated words, seeded, so every run embeds the same
# token counts.
WORDS = (
    "the model serves many requests from one process while another waits for its turn on same cores "
    "memory weights cache tokens stream batch queue latency throughput scheduler engine worker "
    "placer gateway embedding decoder encoder prompt answer question document search index vector "
    "cluster node rack zone replica copy load evict arena budget bytes thread lock step"
)


@dataclass(frozen=True)
class ModelLoad:
    """One model's share of the workload: its requests (GenerateRequest or EmbedRequest, all of one kind),
    sent by `in_flight` callers that each take the next request when their previous one finished."""

    name: str
    embed: bool
    requests: list
    in_flight: int


@dataclass(frozen=True)
class Call:
    """One finished call. tokens: generated ids (Generate) or embedded input tokens (Embed usage);
    end_s: since the pass began; output: the token ids, or the embeddings as rows of floats."""

    latency_s: float
    end_s: float
    tokens: int
    output: tuple


@dataclass(frozen=True)
class PassResult:
    """calls: model name -> its calls in request order. wall_s: first call sent to last call finished."""

    wall_s: float
    calls: dict[str, list[Call]]


def generate_load(
    name: str,
    count: int,
    in_flight: int,
    prompt_lens: tuple[int, ...],
    max_tokens: int,
    vocab: int,
    seed: int,
) -> ModelLoad:
    """count greedy ignore_eos Generate requests of exactly max_tokens tokens (prompt ids seeded)."""
    requests = make_requests(
        name, count, prompt_lens, max_tokens, vocab, seed, common_pb2.WORKLOAD_CLASS_REALTIME_CHAT
    )
    return ModelLoad(name, False, requests, in_flight)


def embed_load(
    name: str, count: int, in_flight: int, texts_per_call: int, words: tuple[int, int], seed: int
) -> ModelLoad:
    """count Embed calls of texts_per_call seeded sentences, each of words[0]..words[1] words."""
    rng = random.Random(seed)
    vocabulary = WORDS.split()
    requests = [
        inference_pb2.EmbedRequest(
            model=name,
            inputs=[" ".join(rng.choices(vocabulary, k=rng.randint(*words))) for _ in range(texts_per_call)],
        )
        for _ in range(count)
    ]
    return ModelLoad(name, True, requests, in_flight)


async def run_pass(address: dict[str, str], loads: list[ModelLoad]) -> PassResult:
    """Every model's closed loop at once, each against address[model]; a failed call's AioRpcError
    propagates (the channels close, ending the other calls). Channels connect before the clock starts."""
    # A local subchannel pool per channel: gRPC would otherwise share one connection between the channels
    # of the one-worker configuration (same target), and not in the three-worker one.
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = {load.name: grpc.aio.insecure_channel(address[load.name], options=options) for load in loads}
    try:
        await asyncio.gather(*(asyncio.wait_for(ch.channel_ready(), 30) for ch in channels.values()))
        started = time.perf_counter()
        results = await asyncio.gather(*(_closed_loop(channels[load.name], load, started) for load in loads))
        wall = time.perf_counter() - started
    finally:
        await asyncio.gather(*(ch.close() for ch in channels.values()))
    return PassResult(
        wall_s=wall, calls={load.name: calls for load, calls in zip(loads, results, strict=True)}
    )


async def _closed_loop(channel: grpc.aio.Channel, load: ModelLoad, started: float) -> list[Call]:
    stub = worker_pb2_grpc.WorkerStub(channel)
    calls: list[Call | None] = [None] * len(load.requests)
    next_index = iter(range(len(load.requests)))

    async def caller() -> None:
        for i in next_index:  # one shared iterator: each request is taken by exactly one caller
            sent = time.perf_counter()
            if load.embed:
                reply = await stub.Embed(load.requests[i], timeout=CALL_TIMEOUT_S)
                output: tuple = tuple(tuple(row.values) for row in reply.data)
                tokens = reply.usage.prompt_tokens
            else:
                ids: list[int] = []
                async for response in stub.Generate(load.requests[i], timeout=CALL_TIMEOUT_S):
                    ids.extend(response.token_ids)
                output, tokens = tuple(ids), len(ids)
            end = time.perf_counter()
            calls[i] = Call(latency_s=end - sent, end_s=end - started, tokens=tokens, output=output)

    await asyncio.gather(*(caller() for _ in range(load.in_flight)))
    return [call for call in calls if call is not None]
