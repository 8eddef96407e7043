"""Worker.GenerateStreams, many Generate streams on one call, driven through the gateway's WorkerLink
(and raw where the protocol itself is under test), against a real worker over loopback: streams equal
Generate calls, an error ends only its own stream with the status a call would get, cancelling a stream
or dropping the call frees the KV at once, deadlines hold, and a draining worker refuses new streams
and ends the call once the running ones are done."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from hanzo.inference.v1 import common_pb2, inference_pb2, worker_pb2, worker_pb2_grpc
from services.gateway.worker_link import LinkStream, WorkerLink
from services.worker.server.app import WorkerApp
from services.worker.server.config import WorkerSettings
from tests.placer.cluster_helpers import eventually
from tests.worker.server.serving import no_placer, serving

CHAT = common_pb2.WORKLOAD_CLASS_REALTIME_CHAT


def generate(
    prompt: str, max_tokens: int = 8, model: str = "llama", **sampling: object
) -> inference_pb2.GenerateRequest:
    params = inference_pb2.SamplingParams(
        **{"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, **sampling}  # type: ignore[arg-type]
    )
    return inference_pb2.GenerateRequest(model=model, prompt=prompt, sampling=params, workload_class=CHAT)


@contextlib.asynccontextmanager
async def linked_worker(
    tmp_path: Path, model_dir: Path
) -> AsyncIterator[tuple[WorkerApp, worker_pb2_grpc.WorkerStub, WorkerLink]]:
    settings = WorkerSettings(
        port=0, node_id="w1", placer_address=no_placer(tmp_path), models={"llama": model_dir},
        heartbeat_interval_s=60.0, drain_timeout_s=5.0,
    )  # fmt: skip
    async with serving(settings) as (app, stub):
        link = WorkerLink(stub, app.address)
        try:
            yield app, stub, link
        finally:
            await link.close()


async def tokens_of(stream: AsyncIterator[inference_pb2.GenerateResponse]) -> list[int]:
    return [t async for response in stream for t in response.token_ids]


async def status_of(stream: LinkStream) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await tokens_of(stream)
    return failed.value.code(), failed.value.details() or ""


def kv_in_use(app: WorkerApp) -> int:
    return sum(m.kv_blocks_used for m in app.servicer.stats().models)


async def kv_freed(app: WorkerApp, why: str) -> None:
    async def idle() -> bool:
        return kv_in_use(app) == 0 and all(m.running == 0 for m in app.servicer.stats().models)

    await eventually(idle, 10, why)


async def test_streams_on_one_call_equal_generate_calls(tmp_path, llama_gqa_dir) -> None:
    prompts = ["once upon a time", "the quick brown fox", "GPU"]
    async with linked_worker(tmp_path, llama_gqa_dir) as (app, stub, link):
        expected = [await tokens_of(stub.Generate(generate(p))) for p in prompts]
        streams = [link.start(generate(p), None, {}) for p in prompts]
        got = await asyncio.gather(*(tokens_of(s) for s in streams))
        assert got == expected and all(len(t) == 8 for t in got)
        assert len(app.servicer.sessions) == 1  # every stream went over the one call


async def test_an_error_ends_only_its_own_stream(tmp_path, llama_gqa_dir) -> None:
    async with linked_worker(tmp_path, llama_gqa_dir) as (_, _, link):
        good = link.start(generate("hello", max_tokens=12), None, {})
        unknown = link.start(generate("hello", model="no-such-model"), None, {})
        invalid = link.start(generate("hello", temperature=-1.0), None, {})
        code, details = await status_of(unknown)
        assert code == grpc.StatusCode.NOT_FOUND and "no-such-model" in details
        code, details = await status_of(invalid)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in details
        assert len(await tokens_of(good)) == 12


async def test_cancelling_a_stream_frees_its_kv_and_keeps_the_call(tmp_path, llama_gqa_dir) -> None:
    async with linked_worker(tmp_path, llama_gqa_dir) as (app, _, link):
        stream = link.start(generate("tell me everything", max_tokens=900), None, {})
        await anext(stream)
        assert kv_in_use(app) > 0
        stream.cancel()
        await kv_freed(app, "the worker's KV back to idle after the stream was cancelled")
        assert app.host.models["llama"].llm.engine.stats.generated_tokens < 900
        assert len(await tokens_of(link.start(generate("again"), None, {}))) == 8
        assert len(app.servicer.sessions) == 1


async def test_a_caller_that_goes_away_cancels_its_streams(tmp_path, llama_gqa_dir) -> None:
    async with linked_worker(tmp_path, llama_gqa_dir) as (app, stub, _):
        call = stub.GenerateStreams()
        start = worker_pb2.StreamStart(request=generate("tell me everything", max_tokens=900))
        await call.write(worker_pb2.StreamRequest(stream_id=1, start=start))
        await call.read()
        call.cancel()
        await kv_freed(app, "the worker's KV back to idle after the call was dropped")
        assert app.host.models["llama"].llm.engine.stats.generated_tokens < 900  # aborted, not run out

        async def closed() -> bool:
            return not app.servicer.sessions

        await eventually(closed, 10, "the worker forgot the dropped call")


async def test_a_deadline_ends_the_stream_with_deadline_exceeded(tmp_path, llama_gqa_dir) -> None:
    async with linked_worker(tmp_path, llama_gqa_dir) as (app, _, link):
        stream = link.start(generate("tell me everything", max_tokens=900), 0.2, {})
        code, details = await status_of(stream)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "deadline" in details
        await kv_freed(app, "the worker's KV back to idle after the deadline")


async def test_malformed_stream_requests_are_refused(tmp_path, llama_gqa_dir) -> None:
    async with linked_worker(tmp_path, llama_gqa_dir) as (_, stub, _):
        call = stub.GenerateStreams()
        for _ in range(2):
            start = worker_pb2.StreamStart(request=generate("hello", max_tokens=20))
            await call.write(worker_pb2.StreamRequest(stream_id=7, start=start))
        await call.write(worker_pb2.StreamRequest(stream_id=8))  # neither start nor cancel
        bad_timeout = worker_pb2.StreamStart(request=generate("hello"), timeout_s=float("nan"))
        await call.write(worker_pb2.StreamRequest(stream_id=9, start=bad_timeout))
        await call.done_writing()
        ends, tokens = [], 0
        async for batch in call:
            for event in batch.events:
                if event.HasField("end"):
                    ends.append((event.end.code, event.end.details))
                else:
                    tokens += len(event.response.token_ids)
        # The second start is refused; the first stream runs to its end, then the call ends.
        invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert ends == [
            (invalid, "stream_id 7 is in use on this call"),
            (invalid, "a StreamRequest needs start or cancel set"),
            (invalid, "timeout_s must be a finite number of seconds >= 0 (0: none), got nan"),
            (grpc.StatusCode.OK.value[0], ""),
        ]
        assert tokens == 20


async def test_a_draining_worker_refuses_new_streams_and_ends_the_call(tmp_path, llama_gqa_dir) -> None:
    async with linked_worker(tmp_path, llama_gqa_dir) as (app, _, link):
        running = link.start(generate("once upon a time", max_tokens=40), None, {})
        first = await anext(running)
        app.servicer.drain()
        code, details = await status_of(link.start(generate("too late"), None, {}))
        assert code == grpc.StatusCode.UNAVAILABLE and "draining" in details  # the gateway retries elsewhere
        rest = await tokens_of(running)
        assert len(first.token_ids) + len(rest) == 40  # nothing already running is lost

        async def ended() -> bool:
            return not app.servicer.sessions

        await eventually(ended, 10, "the call ended once its streams were done")
        # The link then opens a new call; a draining worker refuses on that one too.
        code, _ = await status_of(link.start(generate("later"), None, {}))
        assert code == grpc.StatusCode.UNAVAILABLE


async def test_a_stream_cancelled_as_it_starts_leaves_the_others_running(tmp_path, llama_gqa_dir) -> None:
    async with linked_worker(tmp_path, llama_gqa_dir) as (app, _, link):
        running = link.start(generate("once upon a time", max_tokens=30), None, {})
        for i in range(5):  # cancelled before the link's writer has sent the start: start, then cancel
            link.start(generate(f"never mind {i}", max_tokens=900), None, {}).cancel()
        assert len(await tokens_of(running)) == 30
        await kv_freed(app, "the worker's KV back to idle: the cancelled starts were aborted")
        assert app.host.models["llama"].llm.engine.stats.generated_tokens < 30 + 900
        assert len(app.servicer.sessions) == 1
