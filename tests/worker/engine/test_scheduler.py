"""Scheduler with plain Sequences and a fake sampler: token budget, chunking, FCFS, preemption, abort.

These pin the continuous-batching mechanism itself, so they run the `fifo` policy; the adaptive
policy's ordering, budget and admission are in test_policy_*.py."""

from __future__ import annotations

import random

import pytest

from services.common.sampling import SamplingParams
from services.worker.engine.block_manager import BlockManager
from services.worker.engine.errors import InvalidRequestError
from services.worker.engine.policy.classes import PolicyConfig, PolicyName
from services.worker.engine.scheduled_batch import ScheduledBatch
from services.worker.engine.scheduler import Scheduler
from services.worker.engine.scheduler_config import SchedulerConfig
from services.worker.engine.sequence import FinishReason, Sequence, SequenceStatus

TOKEN = 7  # what the fake model always samples; also an EOS id, so ignore_eos is exercised


def make_seq(request_id: str, num_prompt: int, max_tokens: int = 4, first: int = 100) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Sequence(request_id, list(range(first, first + num_prompt)), params, frozenset({TOKEN}))


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 16,
    budget: int = 512,
    max_num_seqs: int = 64,
    watermark: float = 0.0,
    prefix_caching: bool = True,
    max_model_len: int = 4096,
) -> Scheduler:
    config = SchedulerConfig(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        watermark=watermark,
        policy=PolicyConfig(name=PolicyName.FIFO),
    )
    return Scheduler(config, BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching))


def step(sched: Scheduler) -> tuple[ScheduledBatch | None, list[Sequence]]:
    """Run one fake model step: sample TOKEN for every sequence that reached its end."""
    batch = sched.schedule()
    if batch is None:
        return None, []
    return batch, sched.update(batch, [TOKEN if s else None for s in batch.will_sample])


def ids(seqs: list[Sequence]) -> list[str]:
    return [s.request_id for s in seqs]


def test_mixed_step_has_decodes_and_a_prefill_chunk() -> None:
    sched = make_scheduler(budget=64)
    for rid in ("a", "b"):
        sched.add(make_seq(rid, 10))
    batch, _ = step(sched)
    assert batch is not None
    assert (ids(batch.seqs), batch.num_tokens) == (["a", "b"], [10, 10])
    sched.add(make_seq("c", 100))
    batch, _ = step(sched)
    assert batch is not None
    assert ids(batch.seqs) == ["a", "b", "c"]
    assert batch.num_tokens == [1, 1, 62]
    assert batch.will_sample == [True, True, False]
    assert batch.total_tokens == 64


def test_chunked_prefill_of_300_tokens_with_budget_64_takes_5_steps() -> None:
    sched = make_scheduler(budget=64)
    seq = make_seq("long", 300)
    sched.add(seq)
    chunks = []
    while seq.num_output_tokens == 0:
        batch, _ = step(sched)
        assert batch is not None
        chunks.append((batch.num_tokens[0], batch.will_sample[0]))
    assert chunks == [(64, False)] * 4 + [(44, True)]
    assert seq.num_computed_tokens == 300


def test_max_num_seqs_is_respected() -> None:
    sched = make_scheduler(max_num_seqs=2)
    for i in range(4):
        sched.add(make_seq(f"s{i}", 5))
    batch, _ = step(sched)
    assert batch is not None
    assert ids(batch.seqs) == ["s0", "s1"]
    assert (sched.num_running, sched.num_waiting) == (2, 2)


def test_fcfs_head_of_line_blocks_later_requests() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4)
    for rid, n, first in (("a", 12, 100), ("b", 8, 200), ("c", 2, 300)):
        sched.add(make_seq(rid, n, first=first))
    batch, _ = step(sched)
    assert batch is not None
    # b needs 2 blocks and only 1 is free; c would fit but must not jump the queue.
    assert ids(batch.seqs) == ["a"]
    assert sched.num_waiting == 2
    assert sched.block_manager.num_used_blocks == 3


def test_watermark_applies_only_while_others_run() -> None:
    sched = make_scheduler(num_blocks=10, block_size=4, watermark=0.2)  # 2 blocks reserved
    sched.add(make_seq("a", 40))  # all 10 blocks: allowed, nothing else is running
    batch, _ = step(sched)
    assert batch is not None and ids(batch.seqs) == ["a"]
    sched.abort("a")
    sched.add(make_seq("b", 24, first=500))  # 6 blocks
    sched.add(make_seq("c", 8, first=900))  # 2 more would leave 2 free, but 3 are needed
    sched.add(make_seq("d", 4, first=950))
    batch, _ = step(sched)
    assert batch is not None
    assert ids(batch.seqs) == ["b", "c"]
    assert sched.num_waiting == 1


def test_prefix_cache_hits_are_free_of_budget() -> None:
    sched = make_scheduler(budget=512)
    first = make_seq("a", 40, max_tokens=1)
    sched.add(first)
    step(sched)
    assert first.is_finished
    again = make_seq("b", 40, max_tokens=1)
    sched.add(again)
    batch, _ = step(sched)
    assert batch is not None
    assert batch.num_tokens == [8]
    assert again.num_cached_tokens == 32


def test_preempts_latest_admitted_and_it_finishes_later() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4)
    a, b = make_seq("a", 6, max_tokens=6, first=100), make_seq("b", 6, max_tokens=6, first=200)
    sched.add(a)
    sched.add(b)
    preempted: list[str] = []
    for _ in range(50):
        batch, _ = step(sched)
        if batch is None:
            break
        preempted += ids(batch.preempted)
    assert not sched.has_unfinished
    assert preempted == ["b"]
    assert (a.num_preemptions, b.num_preemptions) == (0, 1)
    assert [s.num_output_tokens for s in (a, b)] == [6, 6]
    assert [s.finish_reason for s in (a, b)] == [FinishReason.LENGTH] * 2
    assert b.output_token_ids == [TOKEN] * 6
    assert sched.block_manager.num_used_blocks == 0


def test_running_sequence_can_preempt_itself_but_not_earlier_ones() -> None:
    sched = make_scheduler(num_blocks=3, block_size=4)
    a, b = make_seq("a", 5, max_tokens=8), make_seq("b", 3, max_tokens=8, first=300)
    sched.add(a)
    sched.add(b)
    step(sched)  # a: 2 blocks, b: 1 block
    step(sched)  # both decode inside their last block
    batch, _ = step(sched)  # b needs a 2nd block: the only victim left is b itself
    assert batch is not None
    assert ids(batch.seqs) == ["a"]
    assert ids(batch.preempted) == ["b"]
    assert (b.status, b.block_table, b.num_computed_tokens) == (SequenceStatus.WAITING, [], 0)
    assert (sched.num_running, sched.num_waiting) == (1, 1)


def test_abort_waiting_and_running_frees_blocks() -> None:
    sched = make_scheduler(max_num_seqs=1)
    a, b = make_seq("a", 20), make_seq("b", 20, first=500)
    sched.add(a)
    sched.add(b)
    step(sched)
    assert (a.status, b.status) == (SequenceStatus.RUNNING, SequenceStatus.WAITING)
    assert sched.abort("b") is b
    assert (b.status, b.finish_reason, sched.num_waiting) == (SequenceStatus.FINISHED, FinishReason.ABORT, 0)
    assert sched.abort("a") is a
    assert (a.finish_reason, sched.num_running, a.block_table) == (FinishReason.ABORT, 0, [])
    assert sched.block_manager.num_used_blocks == 0
    assert sched.abort("a") is None
    assert sched.abort("nobody") is None
    assert not sched.has_unfinished
    assert sched.schedule() is None


def test_abort_between_schedule_and_update_is_skipped() -> None:
    sched = make_scheduler()
    a, b = make_seq("a", 4), make_seq("b", 4, first=500)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert batch is not None
    sched.abort("a")
    finished = sched.update(batch, [TOKEN, TOKEN])
    assert finished == []
    assert (a.num_tokens, a.num_computed_tokens) == (4, 0)  # untouched: blocks already gone
    assert b.num_output_tokens == 1
    assert ids(sched.schedule().seqs) == ["b"]  # type: ignore[union-attr]


def test_engine_finish_frees_now() -> None:
    sched = make_scheduler()
    seq = make_seq("a", 4)
    sched.add(seq)
    step(sched)
    sched.finish(seq, FinishReason.STOP)
    assert (seq.status, seq.finish_reason) == (SequenceStatus.FINISHED, FinishReason.STOP)
    assert sched.num_running == 0
    assert sched.block_manager.num_used_blocks == 0
    sched.finish(seq, FinishReason.ABORT)  # already finished: no-op
    assert seq.finish_reason is FinishReason.STOP


def test_sequence_filling_the_pool_finishes_with_length() -> None:
    sched = make_scheduler(num_blocks=2, block_size=4)  # 8 token slots
    seq = make_seq("a", 6, max_tokens=10)
    sched.add(seq)
    for _ in range(10):
        step(sched)
    assert (seq.finish_reason, seq.num_tokens) == (FinishReason.LENGTH, 8)
    assert sched.block_manager.num_used_blocks == 0


@pytest.mark.parametrize(
    ("seq", "match"),
    [
        (make_seq("big", 65), "KV pool"),
        (make_seq("empty", 0), "at least one token"),
    ],
)
def test_add_rejects_sequences_that_can_never_run(seq: Sequence, match: str) -> None:
    sched = make_scheduler(num_blocks=4, block_size=16)
    with pytest.raises(InvalidRequestError, match=match):
        sched.add(seq)


def test_add_rejects_duplicate_request_id() -> None:
    sched = make_scheduler()
    sched.add(make_seq("a", 4))
    with pytest.raises(InvalidRequestError, match="already in flight"):
        sched.add(make_seq("a", 4))


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_random_workload_runs_to_completion_without_leaks(prefix_caching: bool) -> None:
    rng = random.Random(1234)
    budget, max_num_seqs = 32, 8
    sched = make_scheduler(
        num_blocks=16, block_size=4, budget=budget, max_num_seqs=max_num_seqs, prefix_caching=prefix_caching
    )
    shared = [rng.randrange(1000) for _ in range(16)]  # a common system prompt for some requests
    pending = []
    for i in range(50):
        num_prompt = rng.randint(1, 40)
        seq = make_seq(f"r{i}", 0, max_tokens=rng.randint(1, 20))
        head = shared[: min(num_prompt, 16)] if rng.random() < 0.5 else []
        seq.token_ids = head + [rng.randrange(1000) for _ in range(num_prompt - len(head))]
        seq.num_prompt_tokens = num_prompt
        pending.append(seq)
    everyone = list(pending)
    for _ in range(5000):
        # Staggered arrivals: a few new requests join every step.
        for _ in range(rng.randint(0, 3)):
            if pending:
                sched.add(pending.pop(0))
        batch, _ = step(sched)
        if batch is not None:
            assert batch.total_tokens <= budget
            assert len(batch.seqs) <= max_num_seqs
            assert len({id(s) for s in batch.seqs}) == len(batch.seqs)
        if not pending and not sched.has_unfinished:
            break
    assert not sched.has_unfinished
    assert sched.block_manager.num_used_blocks == 0
    assert all(s.finish_reason is FinishReason.LENGTH for s in everyone)
    assert all(s.num_output_tokens == s.params.max_tokens for s in everyone)
    assert sum(s.num_preemptions for s in everyone) > 0  # the pool really was too small
    if prefix_caching:
        assert sched.block_manager.prefix_hit_tokens > 0
