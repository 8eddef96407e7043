"""Drives a planned workload through the gateway's Inference API over real gRPC, with bounded in-flight.

Chat, Generate and Embed each as a real client calls them; every stream is checked (a finish_reason, its
streamed token ids adding up to usage) and its text kept, so the report can show what the model said
and a probe with a known answer can fail the run when the answer is wrong.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc
from services.common.workload import WorkloadClass
from services.mesh.workload import PlannedRequest

OK = "OK"
NOT_SENT = "NOT_SENT"  # the time budget ran out before the request's turn came
WRONG_ANSWER = "WRONG_ANSWER"  # the stream was sound but the answer lacks the text it had to contain


@dataclass(frozen=True)
class RequestResult:
    """What one request got. status: OK, a grpc.StatusCode name, NOT_SENT, or a client-side check that
    failed (NO_FINISH, TOKEN_MISMATCH, BAD_RESPONSE, WRONG_ANSWER). ttft_s: None for embeddings and
    streams without tokens. served_class: the class the gateway said it used (None for embeddings: the
    API omits it). asked: what the request asked (PlannedRequest.asked); text: the generated text (empty
    for embeddings); expected: what the answer had to contain (the probe's), empty for no check."""

    index: int
    workload_class: WorkloadClass
    status: str
    e2e_s: float | None = None
    ttft_s: float | None = None
    output_tokens: int = 0
    node_id: str = ""
    served_class: WorkloadClass | None = None
    sent_at_s: float | None = None  # seconds after the workload started
    message: str = ""
    asked: str = ""
    text: str = ""
    expected: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class DriveOptions:
    """max_in_flight: requests outstanding at once. request_timeout_s: gRPC deadline per request.
    time_budget_s: the whole run; later requests get what is left as their deadline, or are not sent."""

    max_in_flight: int = 8
    request_timeout_s: float = 60.0
    time_budget_s: float = 150.0


def auth_metadata(api_key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {api_key}")]


async def drive(
    address: str,
    api_key: str,
    plan: Sequence[PlannedRequest],
    options: DriveOptions,
    on_done: Callable[[RequestResult], None] = lambda r: None,
) -> list[RequestResult]:
    """Send every planned request at its arrival time; results in plan order. Never raises for RPC errors."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + options.time_budget_s
    in_flight = asyncio.Semaphore(options.max_in_flight)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        async def one(p: PlannedRequest) -> RequestResult:
            await asyncio.sleep(max(0.0, start + p.arrival_s - loop.time()))
            async with in_flight:
                left = deadline - loop.time()
                if left <= 0:
                    result = RequestResult(
                        p.index, p.workload_class, NOT_SENT, asked=p.asked, expected=p.expect
                    )
                else:
                    sent = loop.time() - start
                    timeout = min(options.request_timeout_s, left)
                    result = await _send(stub, p, api_key, timeout, sent)
            on_done(result)
            return result

        return list(await asyncio.gather(*(one(p) for p in plan)))


async def wait_for_models(
    address: str, api_key: str, replicas: Mapping[str, int], timeout_s: float
) -> dict[str, int]:
    """Poll ListModels until each named model has at least the given replicas, or timeout_s passes;
    returns the replicas last seen. Needed because workers register with the placer by heartbeat,
    which can land after their READY line."""
    seen: dict[str, int] = {}
    end = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        while True:
            try:
                resp = await stub.ListModels(
                    inference_pb2.ListModelsRequest(), metadata=auth_metadata(api_key), timeout=5
                )
                seen = {m.name: m.replicas for m in resp.models}
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return seen
            if all(seen.get(m, 0) >= n for m, n in replicas.items()) or time.monotonic() > end:
                return seen
            await asyncio.sleep(0.5)


async def _send(
    stub: inference_pb2_grpc.InferenceStub, p: PlannedRequest, api_key: str, timeout: float, sent: float
) -> RequestResult:
    t0 = time.perf_counter()
    base = {
        "index": p.index,
        "workload_class": p.workload_class,
        "sent_at_s": sent,
        "asked": p.asked,
        "expected": p.expect,
    }
    try:
        if p.workload_class is WorkloadClass.EMBEDDING:
            return await _embed(stub, p, api_key, timeout, t0, base)
        return await _generate(stub, p, api_key, timeout, t0, base)
    except grpc.aio.AioRpcError as err:
        return RequestResult(
            **base, status=err.code().name, e2e_s=time.perf_counter() - t0, message=err.details() or ""
        )
    except Exception as err:  # a client-side bug must cost one request, not the whole run's report
        return RequestResult(**base, status="CLIENT_ERROR", message=f"{type(err).__name__}: {err}")


async def _embed(
    stub: inference_pb2_grpc.InferenceStub,
    p: PlannedRequest,
    api_key: str,
    timeout: float,
    t0: float,
    base: dict[str, Any],
) -> RequestResult:
    req = inference_pb2.EmbedRequest(model=p.model, inputs=list(p.texts))
    resp = await stub.Embed(req, metadata=auth_metadata(api_key), timeout=timeout)
    e2e = time.perf_counter() - t0
    if len(resp.data) != len(p.texts) or any(len(e.values) == 0 for e in resp.data):
        msg = f"{len(resp.data)} embeddings for {len(p.texts)} inputs"
        return RequestResult(**base, status="BAD_RESPONSE", e2e_s=e2e, node_id=resp.node_id, message=msg)
    return RequestResult(**base, status=OK, e2e_s=e2e, node_id=resp.node_id)


async def _generate(
    stub: inference_pb2_grpc.InferenceStub,
    p: PlannedRequest,
    api_key: str,
    timeout: float,
    t0: float,
    base: dict[str, Any],
) -> RequestResult:
    ttft, streamed, node, served, final = None, 0, "", None, None
    parts: list[str] = []
    first = True
    async for msg in _stream(stub, p, auth_metadata(api_key), timeout):
        if first:  # the API puts node and class on the first message only
            node, served, first = msg.node_id, _known_class(msg.workload_class), False
        if msg.token_ids and ttft is None:
            ttft = time.perf_counter() - t0
        streamed += len(msg.token_ids)
        parts.append(msg.text)
        if msg.finish_reason:
            final = msg
    e2e = time.perf_counter() - t0
    text = "".join(parts)
    kw = {
        "e2e_s": e2e,
        "ttft_s": ttft,
        "output_tokens": streamed,
        "node_id": node,
        "served_class": served,
        "text": text,
    }
    if final is None:
        return RequestResult(**base, **kw, status="NO_FINISH", message="stream ended without finish_reason")
    if final.usage.completion_tokens != streamed:
        # Streamed ids must add up to the usage count: a gap or a duplicate means a broken stream.
        msg = f"streamed {streamed} tokens, usage says {final.usage.completion_tokens}"
        return RequestResult(**base, **kw, status="TOKEN_MISMATCH", message=msg)
    if p.expect and p.expect not in text:
        msg = f"the answer lacks {p.expect!r}: {text[:120]!r}"
        return RequestResult(**base, **kw, status=WRONG_ANSWER, message=msg)
    return RequestResult(**base, **kw, status=OK)


def _stream(
    stub: inference_pb2_grpc.InferenceStub, p: PlannedRequest, metadata: list[tuple[str, str]], timeout: float
) -> AsyncIterator[inference_pb2.GenerateResponse]:
    """The response stream of p's Chat or Generate call (both stream GenerateResponse alike)."""
    sampling = inference_pb2.SamplingParams(
        temperature=p.temperature, top_p=0.95, max_tokens=p.max_tokens, seed=p.seed, ignore_eos=p.ignore_eos
    )
    common = {
        "model": p.model,
        "sampling": sampling,
        "workload_class": int(p.workload_class) if p.declare_class else 0,
        "request_id": f"mesh-demo-{p.seed}-{p.index}",
        "tenant": p.tenant,
    }
    if p.rpc == "Chat":
        req = inference_pb2.ChatRequest(
            messages=[inference_pb2.ChatMessage(role=r, content=c) for r, c in p.messages],
            tools=[
                inference_pb2.Tool(name=t.name, description=t.description, parameters_json=t.parameters_json)
                for t in p.tools
            ],
            **common,
        )
        return stub.Chat(req, metadata=metadata, timeout=timeout)
    return stub.Generate(
        inference_pb2.GenerateRequest(prompt=p.prompt, **common), metadata=metadata, timeout=timeout
    )


def _known_class(value: int) -> WorkloadClass | None:
    return WorkloadClass(value) if value in WorkloadClass._value2member_map_ else None
