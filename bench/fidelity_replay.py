"""A sim/trace.py trace served by the real mesh over the gateway's gRPC API, as sim/fidelity.py counts it.

Each session runs as one task: its first request is sent at its start time (open loop), each later turn
its think time after the previous turn's last token. Decoding classes go through Inference.Generate with
token ids (so prompt and output lengths are exactly the trace's: greedy, ignore_eos, max_tokens = the
turn's output), streamed, each declaring its workload class; a turn's prompt is the previous turn's
prompt, the tokens the model really generated for it, then the turn's own new tokens, so a conversation
shares its prefix with its past as a real client's would. Agent tenants and batch jobs share their tool
or instruction prefix (the same ids for every session of the tenant or job). Embeddings go through
Inference.Embed as text of exactly the trace's token count (words that are one WordPiece token each).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import grpc

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc
from services.common.workload import WorkloadClass
from sim.fidelity import Served
from sim.trace import Trace, TraceSession

SMOLLM2_IDS = (100, 49000)  # token ids drawn from: SmolLM2's, clear of its special tokens at the low end
_TIMEOUT_S = 900.0


class Tokens:
    """Deterministic token ids per (seed, key): the same shared prefix for every session of a tenant."""

    def __init__(self, seed: int, words: list[str], vocab: tuple[int, int] = SMOLLM2_IDS) -> None:
        self.seed = seed
        self.words = words
        self.vocab = vocab

    def ids(self, key: object, n: int) -> list[int]:
        rng = random.Random(f"{self.seed}:{key}")
        return [rng.randrange(*self.vocab) for _ in range(n)]

    def text(self, key: object, tokens: int) -> str:
        """Text the encoder tokenizes to exactly `tokens` tokens ([CLS] and [SEP] included)."""
        rng = random.Random(f"{self.seed}:{key}")
        return " ".join(rng.choice(self.words) for _ in range(max(tokens - 2, 1)))


async def replay(
    trace: Trace,
    address: str,
    api_key: str,
    tokens: Tokens,
    on_done: Callable[[Served], None] = lambda s: None,
    on_start: Callable[[float], None] = lambda unix_s: None,
) -> list[Served]:
    """Serve every session of trace through the gateway at address; every request as served. on_start
    is told the wall clock (Unix seconds) at the run's time 0, which lines the requests up with the
    workers' step logs (step_log.py)."""
    metadata = (("authorization", f"Bearer {api_key}"),)
    served: list[Served] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        loop = asyncio.get_running_loop()
        start = loop.time()
        on_start(time.time())

        async def session(s: TraceSession) -> None:
            await asyncio.sleep(max(0.0, start + s.start_s - loop.time()))
            history = tokens.ids(("shared", s.shared_key), s.shared_tokens) if s.shared_tokens else []
            for k, turn in enumerate(s.turns):
                if k:
                    await asyncio.sleep(turn.gap_s)
                sent = loop.time() - start
                if s.workload == WorkloadClass.EMBEDDING:
                    result = await _embed(stub, metadata, s, k, tokens.text((s.index, k), turn.new_tokens))
                else:
                    history = history + tokens.ids((s.index, k), turn.new_tokens)
                    result, generated = await _generate(stub, metadata, s, k, history, turn.output)
                    history = history + generated
                status, ttft, took, prompt, output, cached, node = result
                record = Served(
                    s.workload, s.index, k, sent, ttft, None if took is None else sent + took, prompt, output,
                    status, cached, node=node,
                )  # fmt: skip
                served.append(record)
                on_done(record)
                if status != "OK":
                    return  # the conversation cannot go on without its answer

        await asyncio.gather(*(session(s) for s in trace.sessions))
    return served


# status, ttft, e2e, prompt tokens, output tokens, prompt tokens the worker's prefix cache served, the
# worker that served it (the gateway's node_id; "" where none answered)
Result = tuple[str, float | None, float | None, int, int, int, str]


async def _generate(
    stub: inference_pb2_grpc.InferenceStub,
    metadata: tuple[tuple[str, str], ...],
    s: TraceSession,
    k: int,
    prompt: list[int],
    max_tokens: int,
) -> tuple[Result, list[int]]:
    request = inference_pb2.GenerateRequest(
        model=s.model,
        prompt_token_ids=inference_pb2.TokenIds(ids=prompt),
        sampling=inference_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        workload_class=int(s.workload),
        request_id=f"fidelity-{s.index}-{k}",
    )
    generated: list[int] = []
    ttft = None
    cached = 0
    node = ""
    t0 = time.perf_counter()
    try:
        async for message in stub.Generate(request, metadata=metadata, timeout=_TIMEOUT_S):
            if message.token_ids and ttft is None:
                ttft = time.perf_counter() - t0
            node = node or message.node_id
            generated += message.token_ids
            if message.finish_reason:
                cached = message.usage.cached_prompt_tokens
    except grpc.aio.AioRpcError as error:
        return (error.code().name, None, None, len(prompt), len(generated), 0, node), generated
    status = "OK" if len(generated) == max_tokens else "TOKEN_MISMATCH"
    return (status, ttft, time.perf_counter() - t0, len(prompt), len(generated), cached, node), generated


async def _embed(
    stub: inference_pb2_grpc.InferenceStub,
    metadata: tuple[tuple[str, str], ...],
    s: TraceSession,
    k: int,
    text: str,
) -> Result:
    t0 = time.perf_counter()
    try:
        reply = await stub.Embed(
            inference_pb2.EmbedRequest(model=s.model, inputs=[text]), metadata=metadata, timeout=_TIMEOUT_S
        )
    except grpc.aio.AioRpcError as error:
        return error.code().name, None, None, 0, 0, 0, ""
    took = time.perf_counter() - t0
    expected = s.prompt(k)
    status = "OK" if reply.usage.prompt_tokens == expected else "TOKEN_MISMATCH"
    return status, took, took, reply.usage.prompt_tokens, 0, 0, reply.node_id
