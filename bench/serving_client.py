"""The client side of bench/serving.py: one streamed chat request over HTTP (OpenAI chat completions) or
gRPC (the gateway's Inference.Chat), timed chunk by chunk, and an open-loop load of Poisson arrivals.

Both transports record the same thing, so a server's numbers do not depend on which one measured it:
TTFT is the first chunk that carries output (text over HTTP, token ids over gRPC; vLLM's role-only
opening chunk does not count), every later output chunk adds an inter-token gap, e2e ends with the
stream, and the output token count comes from the server's usage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc
from openai import AsyncOpenAI

from bench.serving_data import ChatRequest
from bench.serving_servers import Endpoint
from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc


@dataclass
class RequestRecord:
    """What one request got. sent: seconds after the run started; chunk_times: perf_counter stamps of
    the output chunks (the first is the first token); error: None, or why the request failed."""

    index: int
    max_tokens: int
    sent: float = 0.0
    started: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    ended: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ended is not None and bool(self.chunk_times)

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.started if self.chunk_times else None

    @property
    def e2e_s(self) -> float | None:
        return None if self.ended is None else self.ended - self.started


# The mesh's workload-class header (the gateway's classifier reads it); vLLM ignores it.
WORKLOAD_HEADER = "x-hanzo-workload"


def auth_metadata(api_key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),)


# One request's stream into its record; raises for transport errors (the load loop records them).
StreamFn = Callable[[ChatRequest, RequestRecord], Awaitable[None]]


class HttpChat:
    """POST /v1/chat/completions with stream=true, read as raw server-sent events: the SDK's pydantic
    chunk objects would cost the client more per token than the JSON it needs."""

    def __init__(self, base_url: str, api_key: str, model: str, workload: str | None = None) -> None:
        # max_retries=0: a retried request would hide an error and double its latency.
        self._client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600.0)
        self._model = model
        self._headers = {WORKLOAD_HEADER: workload} if workload else {}

    async def __call__(self, req: ChatRequest, rec: RequestRecord) -> None:
        async with self._client.chat.completions.with_streaming_response.create(
            model=self._model,
            messages=req.messages,  # type: ignore[arg-type]
            max_tokens=req.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            extra_headers=self._headers,
        ) as response:
            async for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if chunk.get("error"):
                    raise RuntimeError(f"error event: {chunk['error']}")
                # Only chunks with text count: servers differ in whether they send a chunk for a token
                # that decodes to "" (an ignored end of turn) or one just for finish_reason.
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                    rec.chunk_times.append(now)
                if usage := chunk.get("usage"):
                    rec.output_tokens = usage.get("completion_tokens")
                    rec.prompt_tokens = usage.get("prompt_tokens")

    async def close(self) -> None:
        await self._client.close()


class GrpcChat:
    """Inference.Chat on the gateway: same messages and sampling as the HTTP request."""

    def __init__(self, address: str, api_key: str, model: str, workload: str | None = None) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self._chat = inference_pb2_grpc.InferenceStub(self._channel).Chat
        self._metadata = auth_metadata(api_key) + (((WORKLOAD_HEADER, workload),) if workload else ())
        self._model = model

    async def __call__(self, req: ChatRequest, rec: RequestRecord) -> None:
        request = inference_pb2.ChatRequest(
            model=self._model,
            messages=[inference_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in req.messages],
            sampling=inference_pb2.SamplingParams(
                temperature=0.0, max_tokens=req.max_tokens, ignore_eos=True
            ),
        )
        async for msg in self._chat(request, metadata=self._metadata):
            if msg.token_ids:
                rec.chunk_times.append(time.perf_counter())
            if msg.finish_reason:
                rec.output_tokens = msg.usage.completion_tokens
                rec.prompt_tokens = msg.usage.prompt_tokens

    async def close(self) -> None:
        await self._channel.close()


async def one_request(stream: StreamFn, req: ChatRequest, rec: RequestRecord) -> None:
    """Run one stream into rec; never raises, so one failure costs one request, not the run."""
    rec.started = time.perf_counter()
    try:
        await stream(req, rec)
        rec.ended = time.perf_counter()
        if not rec.chunk_times:
            rec.error = "no output chunk"
    except asyncio.CancelledError:
        rec.error = "run time budget exhausted"
    except grpc.aio.AioRpcError as err:
        rec.error = f"{err.code().name}: {err.details()}"
    except Exception as err:  # HTTP status errors, broken streams, bad JSON: all count as errors
        rec.error = f"{type(err).__name__}: {err}"[:300]


async def http_model(endpoint: Endpoint) -> str:
    """The served model's name (GET /v1/models): vLLM names it by its path, the mesh by its own rule."""
    async with AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0) as client:
        models = [m.id async for m in client.models.list()]
    if not models:
        raise SystemExit(f"{endpoint.name}: /v1/models lists no model")
    return models[0]


async def grpc_model(endpoint: Endpoint) -> str:
    """The first generate model the gateway's ListModels names."""
    assert endpoint.grpc_address is not None
    async with grpc.aio.insecure_channel(endpoint.grpc_address) as channel:
        reply = await inference_pb2_grpc.InferenceStub(channel).ListModels(
            inference_pb2.ListModelsRequest(), metadata=auth_metadata(endpoint.api_key), timeout=10
        )
    names = [m.name for m in reply.models if m.kind == "generate"]
    if not names:
        raise SystemExit(f"{endpoint.name}: ListModels names no generate model")
    return names[0]


async def warm_up(stream: StreamFn, requests: Sequence[ChatRequest], name: str, count: int = 2) -> None:
    """A few short untimed requests, one after another: first-request costs (connection set-up, lazy
    initialisation) stay out of the timed loads, and a server that cannot answer stops the run here."""
    for req in sorted(requests, key=lambda r: r.prompt_tokens)[:count]:
        rec = RequestRecord(req.index, 8)
        await one_request(stream, dataclasses.replace(req, max_tokens=8), rec)
        if not rec.ok:
            raise SystemExit(f"{name}: warm-up request failed: {rec.error}")


def arrival_offsets(count: int, rate: float, seed: int) -> list[float]:
    """Send times (s after the start) of a Poisson process at rate requests/s, as benchmark_serving's
    exponential gaps; rate inf sends everything at once."""
    if rate == float("inf"):
        return [0.0] * count
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


@dataclass(frozen=True)
class RunResult:
    rate: float
    duration_s: float  # first send to the last stream's end (or the budget's end)
    records: list[RequestRecord]
    timed_out: bool
    # CPU seconds this client process spent on the run: on 2 cores it takes from the server, so the
    # report says how much (and HTTP's JSON costs a client more than gRPC's protobuf).
    client_cpu_s: float


async def run_load(
    stream: StreamFn, requests: Sequence[ChatRequest], rate: float, seed: int, budget_s: float
) -> RunResult:
    """Send every request at its Poisson arrival time and wait for all streams, at most budget_s; what is
    still open then is cancelled and counted as an error."""
    offsets = arrival_offsets(len(requests), rate, seed)
    records = [RequestRecord(r.index, r.max_tokens) for r in requests]
    loop = asyncio.get_running_loop()
    start = loop.time()
    cpu_start = time.process_time()

    async def send(i: int) -> None:
        await asyncio.sleep(max(0.0, start + offsets[i] - loop.time()))
        records[i].sent = loop.time() - start
        await one_request(stream, requests[i], records[i])

    tasks = [asyncio.create_task(send(i)) for i in range(len(requests))]
    _, pending = await asyncio.wait(tasks, timeout=budget_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for rec in records:
        if rec.ended is None and rec.error is None:
            rec.error = "not sent before the time budget ran out"
    ends = [r.ended for r in records if r.ended is not None]
    first = min((r.started for r in records if r.started), default=time.perf_counter())
    duration = (max(ends) if ends and not pending else time.perf_counter()) - first
    return RunResult(
        rate=rate,
        duration_s=duration,
        records=records,
        timed_out=bool(pending),
        client_cpu_s=time.process_time() - cpu_start,
    )
