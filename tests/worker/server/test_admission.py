"""Engine admission through the worker's gRPC service: a full class queue and a queue timeout answer
RESOURCE_EXHAUSTED with a retry hint (worded as the worker's own max_waiting refusal, so the gateway
treats both alike), nothing accepted is lost, and the refusals, preemptions and step budgets show in
the worker's metrics. A real worker over loopback with a tiny checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from hanzo.inference.v1 import common_pb2, inference_pb2, worker_pb2_grpc
from services.common.errors import ResourceExhausted
from services.common.retry_info import retry_after_of
from services.common.workload import WorkloadClass
from services.worker.engine.errors import AdmissionError
from services.worker.server.app import WorkerApp
from services.worker.server.config import WorkerSettings, parse_class_policies
from services.worker.server.error_status import worker_status
from tests.placer.cluster_helpers import eventually
from tests.worker.server.serving import no_placer, serving

BATCH = common_pb2.WORKLOAD_CLASS_BATCH
CHAT = common_pb2.WORKLOAD_CLASS_REALTIME_CHAT
BUDGET = 128  # max_num_batched_tokens: with no latency class in play every step gets the maximum


def generate(max_tokens: int, workload: int = BATCH, **fields: object) -> inference_pb2.GenerateRequest:
    sampling = inference_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return inference_pb2.GenerateRequest(
        model="llama", prompt="once upon a time", sampling=sampling, workload_class=workload, **fields
    )  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running_worker(
    tmp_path: Path, model_dir: Path, policies: str, **overrides: object
) -> AsyncIterator[tuple[WorkerApp, worker_pb2_grpc.WorkerStub]]:
    """One worker with a single seat (a long request keeps everything else queued) and no placer (its
    heartbeats fail quietly against a socket nobody serves)."""
    settings = WorkerSettings(
        port=0, node_id="w1", placer_address=no_placer(tmp_path), models={"llama": model_dir},
        max_num_seqs=1, max_num_batched_tokens=BUDGET, class_policies=parse_class_policies(policies, "test"),
        heartbeat_interval_s=60.0, drain_timeout_s=0.5, **overrides,  # type: ignore[arg-type]
    )  # fmt: skip
    async with serving(settings) as running:
        yield running


def tokens(responses: list[inference_pb2.GenerateResponse]) -> int:
    return sum(len(r.token_ids) for r in responses)


async def rest_of(call: grpc.aio.UnaryStreamCall) -> list[inference_pb2.GenerateResponse]:
    """The remaining responses of a stream already read with read() (gRPC forbids mixing in `async for`)."""
    responses = []
    while (response := await call.read()) is not grpc.aio.EOF:
        responses.append(response)
    return responses


def test_admission_errors_are_answered_as_the_workers_own_refusal() -> None:
    refusal = AdmissionError("the BATCH queue is full", retry_after_s=2.25, reason=AdmissionError.QUEUE_FULL)
    ours = ResourceExhausted("the BATCH queue is full", retry_after_s=2.25)
    expected = (grpc.StatusCode.RESOURCE_EXHAUSTED, str(ours), 2.25)
    assert worker_status(refusal) == worker_status(ours) == expected


async def test_a_full_class_queue_refuses_and_loses_nothing_accepted(tmp_path, llama_gqa_dir) -> None:
    worker = running_worker(tmp_path, llama_gqa_dir, '{"BATCH": {"max_waiting": 1}}', metrics_port=0)
    async with worker as (app, stub):
        scheduler = app.host.models["llama"].llm.engine.scheduler
        running = stub.Generate(generate(300))  # holds the only seat while the rest happens
        first = [await running.read()]
        queued = stub.Generate(generate(4))

        async def batch_queued() -> bool:
            return scheduler.waiting_of(WorkloadClass.BATCH) == 1

        await eventually(batch_queued, 5, "the second BATCH request queued behind the first")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [r async for r in stub.Generate(generate(4))]
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "BATCH queue is full" in err.value.details()
        assert retry_after_of(err.value) is not None and retry_after_of(err.value) > 0
        chat = [r async for r in stub.Generate(generate(4, CHAT))]  # another class's queue is not full
        assert tokens(chat) == 4

        rest = await rest_of(running)
        assert tokens(first + rest) == 300 and rest[-1].finish_reason == inference_pb2.FINISH_REASON_LENGTH
        later = await rest_of(queued)
        assert tokens(later) == 4 and later[-1].finish_reason == inference_pb2.FINISH_REASON_LENGTH

        # Every request has finished, so the engine's counters stand still. The chat request shrank
        # some budgets below the maximum (and they stay short a while after it), so compare to them.
        stats = app.host.models["llama"].llm.engine.stats
        assert stats.steps == sum(stats.steps_by_budget.values()) and BUDGET in stats.steps_by_budget
        want = [
            "hanzo_worker_requests_rejected_total"
            '{model_name="llama",reason="queue_full",workload_class="BATCH"} 1.0',
            f'hanzo_worker_step_token_budget{{model_name="llama"}} {float(stats.last_budget)}',
            *(
                f'hanzo_worker_engine_steps_total{{budget="{budget}",model_name="llama"}} {float(count)}'
                for budget, count in stats.steps_by_budget.items()
            ),
            # Every step in the iteration-token histogram, with the tokens it ran.
            f'hanzo_worker_iteration_tokens_total_count{{model_name="llama"}} {float(stats.steps)}',
            f'hanzo_worker_iteration_tokens_total_sum{{model_name="llama"}} {float(stats.tokens_computed)}',
        ]

        async def exported() -> bool:  # the worker refreshes engine metrics once a second
            text = await asyncio.to_thread(_scrape, app.metrics_port)
            return all(line in text for line in want)

        await eventually(exported, 5, f"/metrics shows {want}")


async def test_a_request_past_its_queue_timeout_gets_resource_exhausted(tmp_path, llama_gqa_dir) -> None:
    async with running_worker(tmp_path, llama_gqa_dir, '{"BATCH": {"queue_timeout_s": 0.2}}') as (app, stub):
        # UNSPECIFIED has no queue timeout and outranks BATCH: it keeps the seat until cancelled.
        running = stub.Generate(generate(900, common_pb2.WORKLOAD_CLASS_UNSPECIFIED))
        await running.read()
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [r async for r in stub.Generate(generate(4))]
        waited = time.monotonic() - started
        running.cancel()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "BATCH queue timeout of 0.2 s" in err.value.details()
        assert retry_after_of(err.value) is not None and retry_after_of(err.value) > 0
        assert waited >= 0.2
        registry = app.metrics.registry
        labels = {"model_name": "llama", "workload_class": "BATCH"}
        assert registry.get_sample_value(
            "hanzo_worker_requests_rejected_total", {**labels, "reason": "queue_timeout"}
        ) == 1.0  # fmt: skip
        assert registry.get_sample_value(
            "hanzo_worker_requests_rejected_total", {**labels, "reason": "queue_full"}
        ) is None  # fmt: skip
        assert app.host.models["llama"].llm.engine.stats.rejections_by_class[WorkloadClass.BATCH] == 1


async def test_preemptions_are_counted_by_the_preempted_class(tmp_path, llama_gqa_dir) -> None:
    async with running_worker(tmp_path, llama_gqa_dir, "") as (app, stub):
        running = stub.Generate(generate(300))  # BATCH in the only seat
        first = [await running.read()]
        chat = [r async for r in stub.Generate(generate(4, CHAT))]  # outranks BATCH: displaces it
        assert tokens(chat) == 4
        rest = await rest_of(running)
        assert tokens(first + rest) == 300, "the preempted request resumes and finishes"
        app.metrics.refresh(app.host.models.values())
        stats = app.host.models["llama"].llm.engine.stats
        assert stats.preemptions_by_class[WorkloadClass.BATCH] >= 1
        preempted = app.metrics.registry.get_sample_value(
            "hanzo_worker_num_preemptions_total", {"model_name": "llama", "workload_class": "BATCH"}
        )
        assert preempted == stats.preemptions_by_class[WorkloadClass.BATCH]
        app.metrics.refresh(app.host.models.values())  # counted once, however often refreshed
        assert preempted == app.metrics.registry.get_sample_value(
            "hanzo_worker_num_preemptions_total", {"model_name": "llama", "workload_class": "BATCH"}
        )


async def test_generate_passes_class_tenant_and_deadline_to_the_engine(tmp_path, llama_gqa_dir) -> None:
    async with running_worker(tmp_path, llama_gqa_dir, "") as (app, stub):
        llm = app.host.models["llama"].llm
        seen = []
        real = llm.generate

        def spy(*args: object, **kwargs: object) -> AsyncIterator:
            seen.append(kwargs["hints"])
            return real(*args, **kwargs)  # type: ignore[arg-type]

        llm.generate = spy  # type: ignore[method-assign]
        call = stub.Generate(generate(2, tenant="acme"), timeout=30)
        await call.read()
        call.cancel()
        [r async for r in stub.Generate(generate(2, CHAT))]
        with_deadline, without = seen
        assert with_deadline.workload is WorkloadClass.BATCH and with_deadline.tenant == "acme"
        assert 25 < with_deadline.deadline - time.monotonic() <= 30
        assert without.workload is WorkloadClass.REALTIME_CHAT and without.deadline is None


def _scrape(port: int | None) -> str:
    assert port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()
