"""Layer-level preemption on a real (tiny) model: a chat prompt that arrives while a batch step runs is
run between that step's layers and its first token delivered before the step ends; nobody's greedy output
changes. The scheduler side (schedule_urgent) with plain sequences, and AsyncLLM's mid-step polling."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from types import SimpleNamespace

import pytest

from services.common.sampling import SamplingParams
from services.common.workload import WorkloadClass
from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.config import EngineConfig
from services.worker.engine.engine_commands import Abort, Add
from services.worker.engine.llm_engine import LLMEngine
from services.worker.engine.outputs import RequestOutput
from services.worker.engine.policy.classes import PolicyName, SchedulingHints
from services.worker.engine.sequence import SequenceStatus
from services.worker.engine.snapshot import snapshot_of
from services.worker.engine.step_interrupts import StepInterrupts
from services.worker.server.metrics import WorkerMetrics
from tests.worker.engine.reference import mixed_prompts
from tests.worker.engine.test_policy_scheduler import AGENT, BATCH, RT, T0, ids, scheduler, seq

DOCS = SchedulingHints(workload=WorkloadClass.BATCH, tenant="docs")
CHAT = SchedulingHints(workload=WorkloadClass.REALTIME_CHAT, tenant="app")
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def _engine(model_dir: Path, policy: PolicyName = PolicyName.ADAPTIVE) -> LLMEngine:
    return LLMEngine(model_dir, EngineConfig(max_num_seqs=8, max_num_batched_tokens=256, policy=policy))


def _collect(outputs: list[RequestOutput], tokens: dict[str, list[int]]) -> None:
    for out in outputs:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)


def _run_to_end(engine: LLMEngine, tokens: dict[str, list[int]]) -> None:
    for _ in range(500):
        if not engine.has_unfinished_requests():
            return
        _collect(engine.step(), tokens)
    raise AssertionError("did not finish in 500 steps")


def test_a_chat_arriving_mid_step_gets_its_first_token_before_the_step_ends(llama_gqa_dir: Path) -> None:
    documents = mixed_prompts(4, vocab=512, seed=41, lengths=[120, 180])
    chat_prompt = mixed_prompts(1, vocab=512, seed=42, lengths=[24])[0]
    expected: dict[str, list[int]] = {}
    alone = _engine(llama_gqa_dir)
    for i, prompt in enumerate(documents):
        alone.add_request(f"doc-{i}", prompt, GREEDY, detokenize=False, hints=DOCS)
    alone.add_request("chat", chat_prompt, GREEDY, detokenize=False, hints=CHAT)
    _run_to_end(alone, expected)

    engine = _engine(llama_gqa_dir)
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(documents):
        engine.add_request(f"doc-{i}", prompt, GREEDY, detokenize=False, hints=DOCS)
    _collect(engine.step(), tokens)  # the documents' prefill is under way
    polls: list[int] = []
    delivered: list[RequestOutput] = []

    def poll() -> None:
        polls.append(len(polls))
        if len(polls) == 1:  # the chat arrives while the batch step is at its first checkpoint
            engine.add_request("chat", chat_prompt, GREEDY, detokenize=False, hints=CHAT)

    returned = engine.step(StepInterrupts(poll=poll, deliver=delivered.extend))
    # At least after every attention and MLP block and after the LM head, in the batch step and in the
    # chat's nested one (a prompt that outranks the chat could interrupt that one in turn); more between
    # prefill chunks and MLP row slices.
    assert len(polls) >= 2 * (2 * engine.model_config.num_hidden_layers + 1)
    assert [o.request_id for o in delivered] == ["chat"] and delivered[0].new_token_ids
    assert "chat" not in {o.request_id for o in returned}  # delivered at once, not with the step
    assert engine.stats.urgent_steps == 1 and engine.stats.preemptions == 0
    _collect(delivered + returned, tokens)
    _run_to_end(engine, tokens)
    assert tokens == expected  # the nested step changed nobody's greedy output
    assert engine.block_manager.num_used_blocks == 0

    metrics = WorkerMetrics()
    snap = snapshot_of(engine)  # what AsyncLLM would publish after this step
    served = SimpleNamespace(name="llama", llm=SimpleNamespace(engine=engine), snapshot=snap)
    metrics.refresh([served])  # type: ignore[list-item]
    assert metrics.registry.get_sample_value("hanzo_worker_urgent_steps_total", {"model_name": "llama"}) == 1


def test_a_step_nested_in_an_urgent_one_still_takes_arrivals(llama_gqa_dir: Path) -> None:
    # A batch step, an agent's prompt nested in it, a chat's nested in the agent's (it outranks all of
    # it), and a document arriving while the chat's runs: taken there, not when the chat's step ends.
    documents = mixed_prompts(3, vocab=512, seed=44, lengths=[120, 160, 90])
    agent, chat = mixed_prompts(2, vocab=512, seed=45, lengths=[200, 60])
    agent_hints = SchedulingHints(workload=WorkloadClass.AGENT_TOOL, tenant="tools")
    expected: dict[str, list[int]] = {}
    alone = _engine(llama_gqa_dir)
    for name, prompt, hints in (("doc-0", documents[0], DOCS), ("doc-1", documents[1], DOCS)):
        alone.add_request(name, prompt, GREEDY, detokenize=False, hints=hints)
    for name, prompt, hints in (
        ("agent", agent, agent_hints),
        ("chat", chat, CHAT),
        ("late", documents[2], DOCS),
    ):
        alone.add_request(name, prompt, GREEDY, detokenize=False, hints=hints)
    _run_to_end(alone, expected)

    engine = _engine(llama_gqa_dir)
    tokens: dict[str, list[int]] = {}
    for name, prompt in (("doc-0", documents[0]), ("doc-1", documents[1])):
        engine.add_request(name, prompt, GREEDY, detokenize=False, hints=DOCS)
    _collect(engine.step(), tokens)
    depths: list[int] = []  # how many steps were executing at each poll

    def poll() -> None:
        depth = engine._executing
        if not depths:
            engine.add_request("agent", agent, GREEDY, detokenize=False, hints=agent_hints)
        elif depth == 2 and 3 not in depths and "chat" not in engine.scheduler.request_ids():
            engine.add_request("chat", chat, GREEDY, detokenize=False, hints=CHAT)
        elif depth == 3 and 3 not in depths:
            engine.add_request("late", documents[2], GREEDY, detokenize=False, hints=DOCS)
        depths.append(depth)

    delivered: list[RequestOutput] = []
    _collect(engine.step(StepInterrupts(poll=poll, deliver=delivered.extend)), tokens)
    assert 3 in depths and "late" in engine.scheduler.request_ids()
    assert [o.request_id for o in delivered] == ["chat", "agent"]  # the chat's first token came first
    assert engine.stats.urgent_steps == 2  # nothing ran inside the chat's step
    _collect(delivered, tokens)
    _run_to_end(engine, tokens)
    assert tokens == expected


def test_fifo_never_polls_and_runs_arrivals_after_the_step(llama_gqa_dir: Path) -> None:
    engine = _engine(llama_gqa_dir, PolicyName.FIFO)
    engine.add_request("doc", mixed_prompts(1, vocab=512, seed=43, lengths=[100])[0], GREEDY, hints=DOCS)
    polled: list[None] = []
    engine.step(StepInterrupts(poll=lambda: polled.append(None), deliver=lambda _: None))
    assert polled == [] and engine.stats.urgent_steps == 0


def test_urgent_batch_takes_latency_heads_into_free_room_and_displaces_nobody() -> None:
    sched = scheduler(num_blocks=64, block_size=4, budget=256)
    for rid in ("doc-0", "doc-1"):
        sched.add(seq(rid, BATCH, prompt=40))
    running = sched.schedule(T0)
    assert running is not None and ids(running.seqs) == ["doc-0", "doc-1"]
    sched.add(seq("late-doc", BATCH, prompt=8))
    sched.add(seq("agent", AGENT, prompt=12))
    sched.add(seq("chat", RT, prompt=8))
    sched.add(seq("chat-2", RT, prompt=8))
    urgent = sched.schedule_urgent(T0)
    assert urgent is not None and ids(urgent.seqs) == ["chat", "chat-2"]  # the top level only
    assert urgent.num_tokens == [8, 8] and all(urgent.will_sample)
    assert all(s.status is SequenceStatus.RUNNING for s in running.seqs)  # the executing batch untouched
    agents = sched.schedule_urgent(T0)
    assert agents is not None and ids(agents.seqs) == ["agent"]
    assert sched.num_waiting == 1 and sched.schedule_urgent(T0) is None  # the batch head waits


@pytest.mark.parametrize(
    ("case", "config", "expected"),
    [
        ("no free seat", {"max_num_seqs": 1}, []),
        ("blocks short", {"num_blocks": 12}, []),  # the running document holds 10 of 12 blocks
        ("fifo", {"name": "fifo"}, []),
        ("layer preemption off", {"layer_preemption": False}, []),
        ("prompt past the budget: its first chunk", {"budget": 16}, ["chat"]),
    ],
)
def test_urgent_batch_only_uses_room_that_is_free(case: str, config: dict, expected: list[str]) -> None:
    sched = scheduler(**{"num_blocks": 64, "block_size": 4, "budget": 256, **config})
    sched.add(seq("doc", BATCH, prompt=40))
    assert sched.schedule(T0) is not None
    sched.add(seq("chat", RT, prompt=24))
    urgent = sched.schedule_urgent(T0)
    assert (ids(urgent.seqs) if urgent else []) == expected
    if urgent is not None and config.get("budget") == 16:
        assert urgent.num_tokens == [16] and urgent.will_sample == [False]


@pytest.mark.parametrize(("latency_reserve", "batch_seats", "nested"), [(0.1, 18, ["chat"]), (0.0, 20, [])])
def test_throughput_classes_leave_seats_for_nested_latency_prompts(
    latency_reserve: float, batch_seats: int, nested: list[str]
) -> None:
    sched = scheduler(
        num_blocks=128, max_num_seqs=20, latency_reserve=latency_reserve, expected_output_tokens=0
    )
    for i in range(25):
        sched.add(seq(f"doc-{i}", BATCH, prompt=8))
    running = sched.schedule(T0)
    assert running is not None and len(running.seqs) == batch_seats  # 10% of 20 seats kept back
    sched.add(seq("chat", RT, prompt=8))
    urgent = sched.schedule_urgent(T0)  # mid-step: only a free seat will do
    assert (ids(urgent.seqs) if urgent else []) == nested


def test_polling_applies_adds_and_keeps_everything_after_another_command_in_order(
    llama_gqa_dir: Path,
) -> None:
    llm = AsyncLLM(_engine(llama_gqa_dir))  # its thread is never started: the test plays the engine thread
    commands = [
        Add("a", [5, 6, 7], GREEDY, CHAT, 0.0, concurrent.futures.Future()),
        Abort("x"),
        Add("b", [5, 6, 8], GREEDY, CHAT, 0.0, concurrent.futures.Future()),
    ]
    for command in commands:
        llm._put(command)
    llm._poll_adds()
    assert llm.engine.scheduler.request_ids() == ["a"]  # b waits behind the abort
    llm._poll_adds()  # polling again mid-step does not skip past the kept command
    assert llm.engine.scheduler.request_ids() == ["a"]
    assert llm._apply_commands(block=False)  # after the step: the abort, then b
    assert llm.engine.scheduler.request_ids() == ["a", "b"]
    assert llm._applied == llm._submitted == 3


def test_a_running_step_publishes_what_it_runs_and_what_arrived(
    llama_gqa_dir: Path,
) -> None:
    """The snapshot the heartbeat reads is republished between a step's layers: the sequences the step
    runs and their blocks, and an arrival taken mid-step, not the queues from before the step."""
    llm = AsyncLLM(_engine(llama_gqa_dir))  # its thread is never started: the test plays the engine thread
    engine = llm.engine
    for i, prompt in enumerate(mixed_prompts(2, vocab=512, seed=43, lengths=[150, 200])):
        engine.add_request(f"doc-{i}", prompt, GREEDY, detokenize=False, hints=DOCS)
    llm._publish()  # as the step loop does when the queues changed, before the step
    before = llm.snapshot
    assert (before.running, before.waiting, before.kv_blocks_used) == (0, 2, 0)
    late = mixed_prompts(1, vocab=512, seed=44, lengths=[30])[0]
    llm._put(Add("late-doc", late, GREEDY, DOCS, 0.0, concurrent.futures.Future()))
    seen = []

    def poll() -> None:
        llm._poll_adds()
        seen.append(llm.snapshot)

    engine.step(StepInterrupts(poll=poll, deliver=lambda outputs: None))
    first = seen[0]  # the first preemption point: the arrival taken, the step's sequences running
    assert first is not before
    assert (first.running, first.waiting) == (2, 1) and first.kv_blocks_used > 0
    assert all(s is first for s in seen[1:4])  # nothing new and little time: no republishing per layer


def test_a_long_step_republishes_its_snapshot_even_with_nothing_arriving(llama_gqa_dir: Path) -> None:
    llm = AsyncLLM(_engine(llama_gqa_dir))
    llm._poll_adds()
    quiet = llm.snapshot
    llm._poll_adds()
    assert llm.snapshot is quiet  # just published, nothing taken
    llm._published_s -= 1.0  # a second into a long step
    llm._poll_adds()
    assert llm.snapshot is not quiet


def test_an_urgent_step_is_interrupted_only_by_prompts_that_outrank_all_of_it() -> None:
    sched = scheduler(num_blocks=64, block_size=4, budget=256)
    sched.add(seq("agent-0", AGENT, prompt=12))
    agents = sched.schedule_urgent(T0)
    assert agents is not None
    sched.add(seq("agent-1", AGENT, prompt=12))
    assert sched.schedule_urgent(T0, outranking=agents.seqs) is None  # another agent waits its turn
    sched.add(seq("chat", RT, prompt=8))
    chats = sched.schedule_urgent(T0, outranking=agents.seqs)
    assert chats is not None and ids(chats.seqs) == ["chat"]
