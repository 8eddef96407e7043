"""The demo's driver against an in-process fake gateway: Chat, Generate and Embed sent as planned, every
stream checked and its text kept, and a wrong probe answer failing its request."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc
from services.common.workload import WorkloadClass
from services.mesh.driver import OK, WRONG_ANSWER, DriveOptions, RequestResult, drive
from services.mesh.models import CHAT_MODEL
from services.mesh.report import build_report
from services.mesh.workload import PROBE_QUESTION, PlannedRequest, plan_workload


class FakeGateway(inference_pb2_grpc.InferenceServicer):
    """Streams max_tokens tokens two at a time, each with a word of text (the probe gets its answer, or
    a wrong one when wrong_probe); classifies as the gateway does (the field, else tools -> agent call,
    else chat); unknown models get NOT_FOUND; checks the API key; keeps every request it got."""

    def __init__(self, api_key: str = "k", wrong_probe: bool = False) -> None:
        self.api_key = api_key
        self.wrong_probe = wrong_probe
        self.received: list[tuple[str, object]] = []

    async def Generate(self, request, context) -> AsyncIterator[inference_pb2.GenerateResponse]:
        self.received.append(("Generate", request))
        async for msg in self._stream(request, context, request.prompt, tools=False):
            yield msg

    async def Chat(self, request, context) -> AsyncIterator[inference_pb2.GenerateResponse]:
        self.received.append(("Chat", request))
        async for msg in self._stream(request, context, request.messages[-1].content, bool(request.tools)):
            yield msg

    async def _stream(self, request, context, asked: str, tools: bool):
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {self.api_key}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad key")
        if request.model != CHAT_MODEL:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.model}")
        cls = request.workload_class or (WorkloadClass.AGENT_TOOL if tools else WorkloadClass.REALTIME_CHAT)
        yield inference_pb2.GenerateResponse(
            workload_class=cls, node_id="w2" if cls == WorkloadClass.BATCH else "w1"
        )
        n = request.sampling.max_tokens
        words = ["word"] * n
        if asked == PROBE_QUESTION:
            words = ("The capital is Lyon ." if self.wrong_probe else "The capital is Paris .").split()
            n = len(words)
        for start in range(0, n, 2):
            ids = list(range(start, min(n, start + 2)))
            yield inference_pb2.GenerateResponse(
                token_ids=ids, text="".join(f" {w}" for w in words[start : start + 2])
            )
        yield inference_pb2.GenerateResponse(
            finish_reason=inference_pb2.FINISH_REASON_STOP, usage=inference_pb2.Usage(completion_tokens=n)
        )

    async def Embed(self, request, context) -> inference_pb2.EmbedResponse:
        self.received.append(("Embed", request))
        data = [inference_pb2.Embedding(values=[0.1, 0.2], index=i) for i in range(len(request.inputs))]
        return inference_pb2.EmbedResponse(data=data, node_id="w1")


async def _drive_fake(
    gateway: FakeGateway, plan: list[PlannedRequest]
) -> tuple[list[RequestResult], list[int]]:
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    seen: list[int] = []
    try:
        results = await drive(
            f"127.0.0.1:{port}", "k", plan, DriveOptions(max_in_flight=4), lambda r: seen.append(r.index)
        )
    finally:
        await server.stop(None)
    return results, seen


async def test_driver_against_fake_gateway() -> None:
    gateway = FakeGateway()
    plan = plan_workload(16, seed=1, rate_rps=200.0)
    plan.append(PlannedRequest(16, WorkloadClass.REALTIME_CHAT, 0.0, "nope", "hi", 4))
    results, seen = await _drive_fake(gateway, plan)
    assert sorted(seen) == list(range(17)) and [r.index for r in results] == list(range(17))
    assert results[16].status == "NOT_FOUND"
    for p, r in zip(plan[:16], results[:16], strict=True):
        assert r.status == OK, r
        assert r.asked == p.asked and r.expected == p.expect
        if p.workload_class is WorkloadClass.EMBEDDING:
            assert r.ttft_s is None and r.node_id == "w1" and not r.text
        elif p.expect:
            assert "Paris" in r.text and 0 < r.ttft_s <= r.e2e_s
        else:
            assert r.output_tokens == p.max_tokens and 0 < r.ttft_s <= r.e2e_s
            assert r.text == " word" * p.max_tokens
            assert r.served_class is p.workload_class  # agent calls classified by their tools
    # Each request went over the RPC its shape names, carrying its messages, tools and sampling.
    by_index = {
        req.request_id.rsplit("-", 1)[-1]: (rpc, req) for rpc, req in gateway.received if rpc != "Embed"
    }
    for p in plan[:16]:
        if p.rpc == "Embed":
            continue
        rpc, req = by_index[str(p.index)]
        assert rpc == p.rpc and req.sampling.max_tokens == p.max_tokens and req.tenant == p.tenant
        assert req.sampling.temperature == p.temperature and req.sampling.ignore_eos == p.ignore_eos
        if rpc == "Chat":
            assert [(m.role, m.content) for m in req.messages] == list(p.messages)
            assert [(t.name, t.parameters_json) for t in req.tools] == [
                (t.name, t.parameters_json) for t in p.tools
            ]
    assert {rpc for rpc, _ in gateway.received} == {"Chat", "Embed", "Generate"}
    report = build_report(results, {})
    assert report["classes"]["batch"]["nodes"] == {"w2": report["classes"]["batch"]["requests"]}
    assert report["classes"]["realtime_chat"]["errors"] == {"NOT_FOUND": 1}
    assert report["probe"]["status"] == OK and "Paris" in report["probe"]["answer"]
    assert all(report["samples"][c] for c in ("realtime_chat", "agent_tool", "batch"))


async def test_driver_fails_a_wrong_probe_answer() -> None:
    results, _ = await _drive_fake(FakeGateway(wrong_probe=True), plan_workload(4, seed=0, rate_rps=200.0))
    (probe,) = [r for r in results if r.expected]
    assert probe.status == WRONG_ANSWER and "Lyon" in probe.text and "Paris" in probe.message
    assert all(r.ok for r in results if not r.expected)
    assert build_report(results, {})["ok"] is False
