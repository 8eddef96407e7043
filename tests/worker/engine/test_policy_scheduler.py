"""The adaptive policy at the scheduler, with plain Sequences and no model (table-driven where it fits):
class priority, EDF, tenant fair share, the latency reserve, displacement, queue limits and timeouts."""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest

from services.common.sampling import SamplingParams
from services.common.workload import WorkloadClass
from services.worker.engine.block_manager import BlockManager
from services.worker.engine.errors import AdmissionError
from services.worker.engine.policy.classes import (
    DEFAULT_CLASS_POLICIES,
    ClassPolicy,
    PolicyConfig,
    PolicyName,
    SchedulingHints,
)
from services.worker.engine.scheduled_batch import ScheduledBatch
from services.worker.engine.scheduler import Scheduler
from services.worker.engine.scheduler_config import SchedulerConfig
from services.worker.engine.sequence import Sequence, SequenceStatus

RT, AGENT, BATCH, ANY = (
    WorkloadClass.REALTIME_CHAT,
    WorkloadClass.AGENT_TOOL,
    WorkloadClass.BATCH,
    WorkloadClass.UNSPECIFIED,
)
TOKEN = 7
T0 = 1000.0  # a fixed "now" so timeouts and SLO slack are exact


def seq(
    rid: str,
    workload: WorkloadClass = BATCH,
    prompt: int = 8,
    max_tokens: int = 4,
    tenant: str = "",
    deadline: float | None = None,
    arrival: float = T0,
) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    hints = SchedulingHints(workload=workload, tenant=tenant, deadline=deadline)
    # Distinct prompts, the same in every run (str hash() is salted per process): no accidental prefix hits.
    first = 100 + 1000 * (zlib.crc32(rid.encode()) % 100_000)
    tokens = list(range(first, first + prompt))
    return Sequence(rid, tokens, params, frozenset({TOKEN}), arrival_time=arrival, hints=hints)


def scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    budget: int = 256,
    max_num_seqs: int = 64,
    **policy: object,
) -> Scheduler:
    config = SchedulerConfig(
        max_model_len=4096,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        policy=PolicyConfig(**policy),  # type: ignore[arg-type]
    )
    return Scheduler(config, BlockManager(num_blocks, block_size))


def classes_with(workload: WorkloadClass, **changes: object) -> dict[WorkloadClass, ClassPolicy]:
    """DESIGN.md's class policies with some fields of one class changed."""
    classes = dict(DEFAULT_CLASS_POLICIES)
    classes[workload] = replace(classes[workload], **changes)  # type: ignore[arg-type]
    return classes


def step(sched: Scheduler, now: float = T0) -> ScheduledBatch | None:
    batch = sched.schedule(now)
    if batch is not None and batch.seqs:
        sched.update(batch, [TOKEN if s else None for s in batch.will_sample])
    return batch


def ids(seqs: list[Sequence]) -> list[str]:
    return [s.request_id for s in seqs]


def admission_order(sched: Scheduler, steps: int = 50) -> list[str]:
    """Request ids in the order they were first scheduled, running steps until nothing is left."""
    order: list[str] = []
    for _ in range(steps):
        batch = step(sched)
        if batch is None:
            break
        order += [s.request_id for s in batch.seqs if s.request_id not in order]
    return order


@pytest.mark.parametrize(
    ("arrivals", "expected"),
    [
        # (id, class, deadline) in arrival order -> admission order with one seat
        ([("b", BATCH, None), ("a", AGENT, None), ("r", RT, None)], ["r", "a", "b"]),
        ([("x", ANY, None), ("b", BATCH, None), ("r", RT, None)], ["r", "x", "b"]),
        # earliest deadline first within a class; no deadline goes after every deadline
        ([("late", RT, T0 + 9), ("none", RT, None), ("soon", RT, T0 + 1)], ["soon", "late", "none"]),
        # a deadline never lifts a request above a more urgent class
        ([("b", BATCH, T0 + 0.1), ("a", AGENT, None)], ["a", "b"]),
    ],
)
def test_admission_order(
    arrivals: list[tuple[str, WorkloadClass, float | None]], expected: list[str]
) -> None:
    sched = scheduler(max_num_seqs=1)
    for i, (rid, workload, deadline) in enumerate(arrivals):
        sched.add(seq(rid, workload, deadline=deadline, arrival=T0 + i * 1e-3))
    assert admission_order(sched) == expected


def test_fifo_ignores_classes() -> None:
    sched = scheduler(max_num_seqs=1, name="fifo")
    for rid, workload in (("b", BATCH), ("a", AGENT), ("r", RT)):
        sched.add(seq(rid, workload))
    assert admission_order(sched) == ["b", "a", "r"]


def test_tenants_of_a_class_share_by_tokens_served() -> None:
    sched = scheduler(max_num_seqs=1)
    for i in range(4):
        sched.add(seq(f"big-{i}", tenant="big", arrival=T0 + i))
    sched.add(seq("small-0", tenant="small", arrival=T0 + 10))
    sched.add(seq("small-1", tenant="small", arrival=T0 + 11))
    order = admission_order(sched)
    # "small" arrived last, yet is not kept waiting until "big" is done: the two alternate.
    assert order == ["big-0", "small-0", "big-1", "small-1", "big-2", "big-3"]


def test_late_tenant_starts_level_instead_of_with_credit() -> None:
    sched = scheduler(max_num_seqs=1)
    for i in range(4):
        sched.add(seq(f"busy-{i}", tenant="busy", arrival=T0 + i))
    for _ in range(8):
        step(sched)  # busy-0 and busy-1 done: 22 tokens served to "busy"
    for i in range(3):
        sched.add(seq(f"new-{i}", tenant="new", arrival=T0 + 10 + i))
    # Counting "new" from 0 would hand it the next 22 tokens outright (new-0 and new-1 back to back);
    # it starts level with "busy" instead, and the two alternate (a tie goes to the earlier arrival).
    assert admission_order(sched) == ["busy-2", "new-0", "busy-3", "new-1", "new-2"]


@pytest.mark.parametrize(
    ("workload", "admitted"),
    [(BATCH, False), (ANY, False), (RT, True), (AGENT, True)],
)
def test_latency_reserve_is_kept_from_throughput_classes(workload: WorkloadClass, admitted: bool) -> None:
    # 40 blocks of 4 tokens, 25% reserved for latency classes; a running request holds 24 blocks.
    sched = scheduler(num_blocks=40, latency_reserve=0.25, expected_output_tokens=0)
    sched.add(seq("holder", ANY, prompt=96, max_tokens=50))
    step(sched)
    # 8 more blocks would leave 8 free, under the 10 reserved: only a latency class may take them.
    sched.add(seq("new", workload, prompt=32))
    batch = step(sched)
    assert batch is not None
    assert ("new" in ids(batch.seqs)) is admitted


def test_admission_leaves_room_for_expected_output() -> None:
    # 20 blocks; a 40-token prompt plus 64 expected output tokens needs 26: too many beside a holder.
    sched = scheduler(num_blocks=30, latency_reserve=0.0, expected_output_tokens=64)
    sched.add(seq("holder", BATCH, prompt=24, max_tokens=100))
    step(sched)
    sched.add(seq("growing", BATCH, prompt=40, max_tokens=100))
    sched.add(seq("short", BATCH, prompt=40, max_tokens=1, arrival=T0 + 1))
    batch = step(sched)
    assert batch is not None
    assert ids(batch.seqs) == ["holder"]  # "growing" would run the pool dry; head-of-line keeps order
    fifo = scheduler(num_blocks=30, name="fifo")
    fifo.add(seq("holder", BATCH, prompt=24, max_tokens=100))
    step(fifo)
    fifo.add(seq("growing", BATCH, prompt=40, max_tokens=100))
    batch = step(fifo)
    assert batch is not None and "growing" in ids(batch.seqs)  # the baseline admits on the chunk alone


def test_realtime_displaces_batch_when_every_seat_is_taken() -> None:
    sched = scheduler(max_num_seqs=2)
    sched.add(seq("b0", BATCH, max_tokens=50))
    sched.add(seq("b1", BATCH, max_tokens=50, arrival=T0 + 1))
    step(sched)
    sched.add(seq("rt", RT, max_tokens=2))
    batch = step(sched)
    assert batch is not None
    # The most recently admitted batch request gives up its seat, in the same step.
    assert ids(batch.preempted) == ["b1"]
    assert ids(batch.seqs) == ["rt", "b0"]
    assert sched.num_running == 2 and sched.num_waiting == 1
    # ... and resumes once the realtime request is done; nothing is lost.
    finished: list[str] = []
    for _ in range(200):
        batch = sched.schedule(T0)
        if batch is None:
            break
        finished += ids(sched.update(batch, [TOKEN if s else None for s in batch.will_sample]))
    assert sorted(finished) == ["b0", "b1", "rt"]


def test_realtime_displaces_batch_when_blocks_run_short() -> None:
    # 16 blocks of 4 tokens; two batch requests hold 14 of them.
    sched = scheduler(num_blocks=16, latency_reserve=0.0, expected_output_tokens=0)
    sched.add(seq("b0", BATCH, prompt=28, max_tokens=50))
    sched.add(seq("b1", BATCH, prompt=28, max_tokens=50, arrival=T0 + 1))
    step(sched)
    sched.add(seq("rt", RT, prompt=16))
    batch = step(sched)
    assert batch is not None
    assert ids(batch.preempted) == ["b1"]
    assert "rt" in ids(batch.seqs)


@pytest.mark.parametrize(
    ("running", "arriving", "preempted"),
    [
        (BATCH, BATCH, False),  # equals never displace each other
        (AGENT, RT, True),
        (RT, AGENT, False),
        (ANY, RT, True),
    ],
)
def test_only_a_more_urgent_class_displaces(
    running: WorkloadClass, arriving: WorkloadClass, preempted: bool
) -> None:
    sched = scheduler(max_num_seqs=1)
    sched.add(seq("old", running, max_tokens=50))
    step(sched)
    sched.add(seq("new", arriving))
    batch = step(sched)
    assert batch is not None
    assert bool(batch.preempted) is preempted
    assert ids(batch.seqs) == (["new"] if preempted else ["old"])


def test_fifo_never_displaces() -> None:
    sched = scheduler(max_num_seqs=1, name="fifo")
    sched.add(seq("b", BATCH, max_tokens=50))
    step(sched)
    sched.add(seq("rt", RT))
    batch = step(sched)
    assert batch is not None and ids(batch.seqs) == ["b"] and not batch.preempted


def test_latency_prompt_is_not_queued_behind_a_long_prefill() -> None:
    sched = scheduler(num_blocks=300, budget=64)
    sched.add(seq("doc", BATCH, prompt=1000))
    step(sched)  # the document's prefill has begun: 64 of 1000 tokens
    sched.add(seq("rt", RT, prompt=20))
    batch = step(sched)
    assert batch is not None
    assert ids(batch.seqs)[0] == "rt" and batch.num_tokens[0] == 20
    assert batch.will_sample[0]  # its whole prompt in this step: the first token comes now


def test_growth_preemption_takes_the_lowest_priority_first() -> None:
    # Every request decodes; the pool runs out as they grow. The batch request goes before the chat.
    sched = scheduler(num_blocks=6, block_size=4, latency_reserve=0.0, expected_output_tokens=0)
    sched.add(seq("b", BATCH, prompt=7, max_tokens=20))
    sched.add(seq("r", RT, prompt=7, max_tokens=20, arrival=T0 + 1))
    preempted: list[str] = []
    for _ in range(10):
        batch = step(sched)
        assert batch is not None
        preempted += ids(batch.preempted)
        if preempted:
            break
    assert preempted == ["b"]


@pytest.mark.parametrize(
    ("workload", "limit_field", "value"),
    [(BATCH, "max_waiting", 2), (RT, "max_waiting", 2)],
)
def test_queue_limit_refuses_with_a_retry_hint(workload: WorkloadClass, limit_field: str, value: int) -> None:
    sched = scheduler(classes=classes_with(workload, **{limit_field: value}))
    sched.add(seq("a", workload))
    sched.add(seq("b", workload))
    with pytest.raises(AdmissionError, match="queue is full") as refused:
        sched.add(seq("c", workload))
    assert refused.value.retry_after_s > 0
    assert sched.num_waiting == 2  # nothing accepted was dropped
    sched.add(seq("other", AGENT if workload is BATCH else BATCH))  # other classes have their own limit


@pytest.mark.parametrize("policy", [PolicyName.FIFO, PolicyName.ADAPTIVE])
def test_one_queue_limit_over_every_class_under_either_policy(policy: PolicyName) -> None:
    """PolicyConfig.max_waiting (the worker's HANZO_WORKER_MAX_WAITING) counts every class together."""
    sched = scheduler(name=policy, max_waiting=2)
    sched.add(seq("a", BATCH))
    sched.add(seq("b", RT))
    with pytest.raises(AdmissionError, match=r"the queue is full \(2 waiting, limit 2\)") as refused:
        sched.add(seq("c", AGENT))
    assert refused.value.reason == AdmissionError.QUEUE_FULL and refused.value.retry_after_s > 0
    assert sched.num_waiting == 2  # nothing accepted was dropped


def test_queue_timeout_refuses_only_never_scheduled_requests() -> None:
    sched = scheduler(max_num_seqs=1, classes=classes_with(BATCH, queue_timeout_s=2.0))
    sched.add(seq("running", BATCH, max_tokens=100))
    step(sched)
    sched.add(seq("stuck", BATCH, arrival=T0 + 0.5))
    batch = step(sched, now=T0 + 1.0)
    assert batch is not None and not batch.rejected
    batch = step(sched, now=T0 + 3.0)
    assert batch is not None
    assert [(s.request_id, type(e)) for s, e in batch.rejected] == [("stuck", AdmissionError)]
    error = batch.rejected[0][1]
    assert "queue timeout" in str(error) and error.retry_after_s > 0
    assert sched.num_waiting == 0 and sched.num_running == 1
    assert batch.rejected[0][0].status is SequenceStatus.FINISHED


def test_preempted_request_is_never_timed_out() -> None:
    sched = scheduler(max_num_seqs=1, classes=classes_with(BATCH, queue_timeout_s=1.0))
    sched.add(seq("b", BATCH, max_tokens=100))
    step(sched)
    sched.add(seq("rt", RT, max_tokens=100))
    batch = step(sched)
    assert batch is not None and ids(batch.preempted) == ["b"]
    batch = step(sched, now=T0 + 50)  # "b" has waited long past the timeout, but it was accepted
    assert batch is not None and not batch.rejected


def test_running_and_waiting_are_counted_per_class_for_the_heartbeat() -> None:
    """What the worker's heartbeat reports as batch_running / batch_waiting (the placer's batch_isolation
    keeps batch and latency work apart by them): two seats, so one of three batch requests waits."""
    sched = scheduler(max_num_seqs=2)
    for rid, workload in (("b1", BATCH), ("b2", BATCH), ("b3", BATCH)):
        sched.add(seq(rid, workload))
    step(sched)
    assert (sched.running_of(BATCH), sched.waiting_of(BATCH)) == (2, 1)
    sched.add(seq("r", RT))
    step(sched)  # whether chat takes a seat from batch or waits, the counts add up to the totals
    assert sched.running_of(BATCH) + sched.running_of(RT) == sched.num_running
    assert sched.waiting_of(BATCH) + sched.waiting_of(RT) == sched.num_waiting


def test_latency_prompt_tokens_count_what_the_latency_classes_still_have_to_prefill() -> None:
    """The heartbeat's latency_prompt_tokens (the placer's prefix cost rule weighs a cached prefix against
    it): queued latency prompts less what the prefix cache holds of them (nothing here), admitted ones
    until their prompt is computed, batch never. A budget of 16 tokens a step: a 40-token chat prompt
    takes three steps."""
    sched = scheduler(budget=16, num_blocks=256)
    sched.add(seq("c", RT, prompt=40))
    sched.add(seq("b", BATCH, prompt=30))
    assert sched.latency_prompt_tokens() == 40
    step(sched)  # 16 of the chat prompt's tokens
    assert sched.latency_prompt_tokens() == 24
    sched.add(seq("a", AGENT, prompt=20))
    assert sched.latency_prompt_tokens() == 44
    for _ in range(4):
        step(sched)
    assert sched.latency_prompt_tokens() == 0  # both prompts computed: decoding is not prefill
    sched.abort("c")
    sched.abort("a")
    assert sched.latency_prompt_tokens() == 0


def test_latency_prompt_tokens_leave_out_a_queued_prompts_cached_prefix() -> None:
    """An agent call whose history the prefix cache holds is counted for its new tokens only, as it will
    compute only those: a worker holding a session's next call queued is not made to look busier than a
    worker without the history. The count a sequence brought leaves with it (admission, abort)."""
    sched = scheduler(budget=64, num_blocks=256)
    history = seq("turn1", AGENT, prompt=40, max_tokens=4)
    sched.add(history)
    while sched.has_unfinished:
        step(sched)
    # 40 prompt + 4 generated tokens, 43 of them computed: 10 whole 4-token blocks cached.
    follow_up = [*history.token_ids, *range(5, 13)]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    turn2 = Sequence("turn2", follow_up, params, frozenset({TOKEN}), hints=SchedulingHints(workload=AGENT))
    sched.add(turn2)
    assert sched.latency_prompt_tokens() == 52 - 40
    sched.add(seq("chat", RT, prompt=20))
    sched.add(seq("doc", BATCH, prompt=30))
    assert sched.latency_prompt_tokens() == 12 + 20
    sched.abort("chat")
    assert sched.latency_prompt_tokens() == 12
    step(sched)  # turn2 admitted with its 40 cached tokens and its 12 new ones computed
    assert turn2.num_cached_tokens == 40
    assert sched.latency_prompt_tokens() == 0
