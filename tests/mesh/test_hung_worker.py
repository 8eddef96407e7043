"""A hung worker, the hardest fault: SIGSTOP keeps its sockets open, so nothing fails by itself. Under
`hanzo-mesh serve --workers 2` on real processes: the gateway's keepalive pings go unanswered, the link
breaks, streams that had already sent tokens end with UNAVAILABLE (well before their deadline), requests
that had sent nothing move to the other worker, new requests are served there, and the hung worker,
once continued, takes traffic again."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import time
from pathlib import Path

import grpc

from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc
from tests.mesh.test_serve import served

KEY = "hung-worker-key"
AUTH = (("authorization", f"Bearer {KEY}"),)
DEADLINE_S = 60.0  # far past keepalive's few seconds: a stream that ends by its deadline was never noticed


def _request(max_tokens: int, n: int = 0) -> inference_pb2.GenerateRequest:
    """Prompts differ by n: requests that share a prefix would all be routed where it is cached."""
    sampling = inference_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return inference_pb2.GenerateRequest(model="tiny", prompt=f"{n} the hung worker", sampling=sampling)


async def _finish(call: grpc.aio.UnaryStreamCall) -> tuple[int, grpc.StatusCode]:
    """Tokens read until the stream ends, and the status it ended with."""
    tokens = 0
    try:
        while (response := await call.read()) is not grpc.aio.EOF:  # read(): its first was read so
            tokens += len(response.token_ids)
    except grpc.aio.AioRpcError as failed:
        return tokens, failed.code()
    return tokens, grpc.StatusCode.OK


async def _served_by(stub: inference_pb2_grpc.InferenceStub, n: int, max_tokens: int = 4) -> str:
    call = stub.Generate(_request(max_tokens, n), metadata=AUTH, timeout=DEADLINE_S)
    first = await call.read()
    tokens, code = len(first.token_ids), grpc.StatusCode.OK
    more, code = await _finish(call)
    assert code == grpc.StatusCode.OK and tokens + more == max_tokens, (code, tokens + more)
    return first.node_id


async def _scenario(gateway: str, pids: dict[str, int]) -> None:
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        streams = [stub.Generate(_request(1900, n), metadata=AUTH, timeout=DEADLINE_S) for n in range(6)]
        firsts = [await call.read() for call in streams]  # each has sent a token: it cannot move now
        hung = firsts[0].node_id
        os.kill(pids[hung], signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            # Sent while the link still looks open: those the gateway gives the hung worker move on.
            fresh = await asyncio.gather(*(_served_by(stub, n) for n in range(10, 14)))
            ended = await asyncio.gather(*(_finish(call) for call in streams))
            noticed_s = time.monotonic() - stopped_at
        finally:
            os.kill(pids[hung], signal.SIGCONT)
        assert hung not in fresh, fresh
        for first, (_, code) in zip(firsts, ended, strict=True):
            if first.node_id == hung:
                assert code == grpc.StatusCode.UNAVAILABLE, code
        assert noticed_s < DEADLINE_S / 2, noticed_s  # keepalive, not the deadline, ended them
        # Continued, the worker is offered again once its ejection ends and heartbeats flow.
        deadline = time.monotonic() + 60
        for batch in itertools.count():
            served_by = await asyncio.gather(*(_served_by(stub, 100 * batch + n) for n in range(100, 104)))
            if hung in served_by:
                break
            assert time.monotonic() < deadline, f"{hung} never took traffic again"


def test_a_hung_worker_is_noticed_and_its_requests_move(tmp_path: Path, llama_gqa_dir: Path) -> None:
    argv = [str(llama_gqa_dir), "--name", "tiny", "--workers", "2", "--port", "0", "--http-port", "0",
            "--max-model-len", "2048", "--api-key", KEY]  # fmt: skip
    with served(tmp_path, *argv) as lines:
        table = (tmp_path / "serve.out").read_text()
        pids = {f"mesh-w{n}": int(pid) for n, pid in re.findall(r"^worker-(\d+)\s+(\d+)", table, re.M)}
        assert len(pids) == 2, table
        asyncio.run(_scenario(lines["gateway"], pids))
