"""The synchronous engine core: add requests, step, collect outputs. One thread drives it."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from services.common.sampling import SamplingParams
from services.common.workload import WorkloadClass
from services.worker.engine.block_manager import BlockManager
from services.worker.engine.config import EngineConfig, EngineLayout
from services.worker.engine.errors import InvalidRequestError
from services.worker.engine.grammar import ModelGrammars
from services.worker.engine.kv_pool import KVPool, kv_spec, plan_layout
from services.worker.engine.model_placement import place_model
from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.outputs import RequestOutput, TextState, make_output
from services.worker.engine.policy.classes import DEFAULT_HINTS, SchedulingHints
from services.worker.engine.request_checks import check_params, prompt_token_ids
from services.worker.engine.scheduled_batch import ScheduledBatch
from services.worker.engine.scheduler import Scheduler
from services.worker.engine.scheduler_config import SchedulerConfig
from services.worker.engine.sequence import FinishReason, Sequence
from services.worker.engine.step_interrupts import StepInterrupts
from services.worker.engine.step_log import StepShape
from services.worker.memory.errors import ModelBusyError, ModelEvictedError
from services.worker.memory.host_copy import HostCopy
from services.worker.memory.manager import MemoryManager
from services.worker.memory.partition import Partition
from services.worker.memory.placement import (
    PlacedModel,
    evict_to_host,
)
from services.worker.models.config_types import DecoderConfig, EncoderConfig
from services.worker.models.linear import pack_model, unpack_model
from services.worker.models.preemption import PreemptionPoints

_URGENT_ROUNDS = 4  # urgent steps at most, back to back, before a step's ordinary batch
# vLLM's buckets of tokens per engine step (vllm:iteration_tokens_total); a larger step counts in +Inf.
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def iteration_bucket(tokens: int) -> int:
    """Index into ITERATION_TOKEN_BUCKETS of the smallest bound >= tokens; len(...) past the last."""
    return bisect.bisect_left(ITERATION_TOKEN_BUCKETS, tokens)


@dataclass
class EngineStats:
    """Cumulative counters since start (for metrics and tests)."""

    steps: int = 0
    preemptions: int = 0
    tokens_computed: int = 0  # tokens run through the model (prefix-cache hits excluded)
    generated_tokens: int = 0
    preemptions_by_class: Counter[WorkloadClass] = field(default_factory=Counter)
    rejections_by_class: Counter[WorkloadClass] = field(default_factory=Counter)  # queue timeouts
    # Steps per chosen token budget, rounded up to a power of two (a bounded set of keys for metrics).
    steps_by_budget: Counter[int] = field(default_factory=Counter)
    last_budget: int = 0
    urgent_steps: int = 0  # steps of latency-class prompts run ahead of, or between the layers of, another
    # Steps per iteration_bucket of the tokens they ran (prompt chunks + decode rows), and those tokens.
    steps_by_tokens: Counter[int] = field(default_factory=Counter)


class LLMEngine:
    """Continuous-batching engine for one decoder model. Not thread-safe: call it from one thread."""

    def __init__(
        self,
        model_dir: str | Path | HostCopy,
        config: EngineConfig | None = None,
        *,
        memory: MemoryManager | None = None,
        model_name: str | None = None,
    ) -> None:
        """model_dir: a checkpoint directory or GGUF file, or the HostCopy an earlier engine's evict()
        returned (then memory is required and nothing is read from disk: the weights come back in one
        bulk copy, into a partition that may sit elsewhere in the arena; config.dtype must be the copy's
        dtype). memory: None loads the weights and allocates the KV cache on their own. A MemoryManager
        builds the model in a new partition of its arena instead (named model_name; None: the
        directory's name or the GGUF file's stem, or the name the host copy was evicted under): weights
        and KV cache are views of it, so serving allocates no cache or weight memory. The KV pool is
        then EngineConfig.kv_cache_bytes (None: 2 GiB, capped at what max_num_seqs full contexts could
        use); config.device must be the arena's device."""
        self.config = config or EngineConfig()
        self.device = torch.device(self.config.device)
        self.memory = memory
        self._placed: PlacedModel | None = None
        self._evicted = False

        def kv_bytes(model: DecoderConfig) -> int:  # the pool an arena's partition reserves
            return plan_layout(self.config, model, self.device, in_arena=True).kv_cache_bytes

        placement = place_model(
            model_dir, _decoder_config, dtype=self.config.dtype, device=self.device, memory=memory,
            model_name=model_name, kv_bytes=kv_bytes,
        )  # fmt: skip
        self.loaded, self.model_config = placement.loaded, placement.config
        self.model_name, self._placed = placement.name, placement.placed
        spec = kv_spec(self.config, self.model_config)
        prefix_caching = self.config.enable_prefix_caching
        # Alone on CUDA the pool is sized by the memory left after the weights; in an arena, as kv_bytes
        # reserved it (in_arena plans without asking the device, so it plans the same again).
        layout = plan_layout(self.config, self.model_config, self.device, in_arena=self._placed is not None)
        if self._placed is None:
            self.kv = KVPool.allocated(spec, layout, self.device, prefix_caching)
        else:
            assert memory is not None  # placed in its arena
            self.kv = KVPool.in_partition(spec, layout, memory, self._placed.partition, prefix_caching)
        self.tokenizer = self.loaded.tokenizer
        self.grammars = ModelGrammars(
            self.tokenizer, self.model_config.vocab_size, self.model_config.eos_token_ids
        )
        self.packed_weight_bytes = 0  # packed CPU copies of the weights (EngineConfig.pack_cpu_weights)
        if self.config.pack_cpu_weights and self.device.type == "cpu":
            self.packed_weight_bytes = pack_model(self.loaded.model, self.model_name or str(model_dir))
        self.runner = ModelRunner(
            self.loaded.model, self.kv.spec, self.kv.caches, self.device, self.config.seed
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_model_len=self.layout.max_model_len,
                max_num_seqs=self.config.max_num_seqs,
                max_num_batched_tokens=self.config.max_num_batched_tokens,
                policy=self.config.scheduling,
            ),
            self.block_manager,
        )
        self.stats = EngineStats()
        self._text: dict[str, TextState] = {}
        self._nested_s = 0.0  # seconds spent in urgent steps so far (see _run)
        self._executing = 0  # steps inside runner.execute now: more than one means a nested step runs
        # Set by an AsyncLLM that logs its steps (step_log.py): every batch _run executes is added to it.
        self.step_shape: StepShape | None = None

    @property
    def layout(self) -> EngineLayout:
        return self.kv.layout

    @property
    def partition(self) -> Partition | None:
        """The model's partition of the arena; None alone, or once evicted."""
        return self.kv.partition

    @property
    def block_manager(self) -> BlockManager:
        return self.kv.blocks

    def kv_blocks_wanted(self) -> int:
        """KV blocks every unfinished request would hold if all ran at once, each with room for one more
        token: compare with layout.num_kv_blocks to see how short the pool is (>= 0)."""
        block_size = self.layout.block_size
        return sum(seq.num_tokens // block_size + 1 for seq in self.scheduler.unfinished())

    def shrink_kv(self, num_blocks: int) -> None:
        """KVPool.shrink, keeping every unfinished request able to fit; call between steps, on the
        engine's thread (then MemoryManager.resize_kv or move_kv, then rebind_kv)."""
        self._check_resident()
        self.kv.shrink(num_blocks, self._largest_request())
        self._bind_kv()

    def rebind_kv(self) -> None:
        """KVPool.rebind over the pool the memory manager now holds for this model; running requests
        recompute if it moved. Call between steps, on the engine's thread."""
        self._check_resident()
        self.kv.rebind(self._largest_request(), self._preempt_all_running)
        self._bind_kv()

    def _largest_request(self) -> int:
        return max((seq.num_tokens for seq in self.scheduler.unfinished()), default=0)

    def _preempt_all_running(self) -> None:
        """Send every running request back to the queue to recompute: its KV is gone (the pool moved)."""
        running = self.scheduler.preempt_all()
        for seq in running:
            self.stats.preemptions_by_class[seq.hints.workload] += 1
        self.stats.preemptions += len(running)

    def _bind_kv(self) -> None:
        """Serve from the pool as it now is, from the next step on."""
        self.runner.set_kv_caches(self.kv.caches)
        if self._placed is not None and self.kv.partition is not None:
            self._placed = replace(self._placed, partition=self.kv.partition)
        self.scheduler.resize_pool(self.layout.num_kv_blocks)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        *,
        detokenize: bool = True,
        hints: SchedulingHints = DEFAULT_HINTS,
        arrival_time: float | None = None,
        grammar: object | None = None,
    ) -> Sequence:
        """Validate and queue a request; raises InvalidRequestError on bad input and AdmissionError when
        its class's queue is full (nothing queued either way). hints: class, tenant, deadline.
        arrival_time: time.monotonic() when the request reached the server (None: now); TTFT targets
        and queue timeouts count from it, so time spent waiting for the step thread counts too.
        grammar: params.structured already compiled (grammars.compile(), off the engine thread); None
        compiles it here."""
        self._check_resident()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("sampling", f"expected SamplingParams, got {type(params).__name__}")
        check_params(params, self.model_config.vocab_size)
        token_ids = prompt_token_ids(
            prompt, self.tokenizer, self.model_config.vocab_size, self.layout.max_model_len
        )
        seq = Sequence(
            request_id,
            token_ids,
            params,
            eos_token_ids=self.model_config.eos_token_ids,
            arrival_time=arrival_time,
            hints=hints,
        )
        seq.matcher = self.grammars.matcher(params, grammar)
        self.scheduler.add(seq)
        if self.tokenizer is not None and (detokenize or params.stop):
            self._text[request_id] = TextState(self.tokenizer, seq)
        return seq

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its KV blocks; its final output, or None if it is not in flight."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return None
        self._forget(request_id)
        return make_output(seq, [], "")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self, interrupts: StepInterrupts | None = None) -> list[RequestOutput]:
        """Run one batched model step; an output for every request that gained a token or finished.
        ModelEvictedError after evict().

        Under a policy with layer preemption, latency-class prompts already waiting first get a step of
        their own (before the batch step, which then keeps its size). With interrupts, the step also
        polls for arrivals at its preemption points (models/preemption.py) and runs those prompts at
        once, nested, handing their outputs to interrupts.deliver; without, they are returned with this
        step's."""
        self._check_resident()
        outputs: list[RequestOutput] = []
        # Again while prompts keep arriving during the urgent steps themselves (bounded: batch work must
        # still get its step under a stream of latency arrivals).
        for _ in range(_URGENT_ROUNDS):
            urgent = self._run_urgent(interrupts)
            if not urgent:
                break
            if interrupts is not None:
                interrupts.deliver(urgent)
            else:
                outputs += urgent
        batch = self.scheduler.schedule()
        if batch is None:
            return outputs
        for seq, error in batch.rejected:
            self.stats.rejections_by_class[seq.hints.workload] += 1
            self._forget(seq.request_id)
            outputs.append(make_output(seq, [], "", error))
        if batch.seqs:
            points = None
            if interrupts is not None and self.scheduler.policy.preempts_between_layers:
                points = self._preemption_points(interrupts, None)
            outputs += self._run(batch, points)
        return outputs

    def _run(self, batch: ScheduledBatch, preemption: PreemptionPoints | None = None) -> list[RequestOutput]:
        """Execute a scheduled batch and apply it: outputs for the sequences that sampled a token."""
        stats = self.stats
        for seq in batch.seqs:
            if seq.first_budget is None:  # its first step: the decision that let it in
                seq.first_budget = batch.budget
                seq.first_nested = self._executing > 0
        nested_before = self._nested_s
        started = time.perf_counter()
        self._executing += 1
        try:
            sampled = self.runner.execute(batch, preemption)
        finally:
            self._executing -= 1
        # Steps nested between this one's layers are timed on their own: the step-time model learns
        # what this shape costs, not what happened to run inside it.
        seconds = time.perf_counter() - started - (self._nested_s - nested_before)
        self.scheduler.observe_step(batch, seconds)
        if self.step_shape is not None:  # read before update() advances the sequences
            self.step_shape.add(batch, seconds)
        self.scheduler.update(batch, sampled)
        stats.steps += 1
        stats.preemptions += len(batch.preempted)
        for seq in batch.preempted:
            stats.preemptions_by_class[seq.hints.workload] += 1
        stats.steps_by_budget[1 << max(0, batch.budget - 1).bit_length()] += 1
        stats.last_budget = batch.budget
        outputs = [
            self._output(seq, token)
            for seq, token in zip(batch.seqs, sampled, strict=True)
            if token is not None  # None: a prefill chunk that has not reached the prompt's end
        ]
        stats.generated_tokens += len(outputs)
        stats.tokens_computed += batch.total_tokens
        stats.steps_by_tokens[iteration_bucket(batch.total_tokens)] += 1
        return outputs

    def _run_urgent(
        self, interrupts: StepInterrupts | None, outranking: ScheduledBatch | None = None
    ) -> list[RequestOutput]:
        """Run the latency-class prompts that fit now (and outrank everything in `outranking`, the urgent
        batch this one would interrupt) in a step of their own; their outputs. An urgent step may itself
        be interrupted, once: by prompts that outrank all of its own (chat prompts during agent ones)."""
        batch = self.scheduler.schedule_urgent(outranking=outranking.seqs if outranking else None)
        if batch is None:
            return []
        points = None
        if interrupts is not None:
            # Nested in another urgent step, it runs nothing inside itself (one level of nesting), but it
            # still takes arrivals at its points: a 1,291-token chat nested in an agent's step took 2.7 s
            # on a CPU worker, and the requests that came meanwhile reached neither the queue nor the
            # snapshot the heartbeat reports until it ended (docs/simulator.md, fidelity run 16).
            nested = outranking is not None
            points = (
                PreemptionPoints(interrupts.poll) if nested else self._preemption_points(interrupts, batch)
            )
        nested_before = self._nested_s
        started = time.perf_counter()
        outputs = self._run(batch, points)
        # Set, not added to: steps nested inside this one counted themselves already, and are part of it.
        self._nested_s = nested_before + time.perf_counter() - started
        self.stats.urgent_steps += 1
        return outputs

    def _preemption_points(
        self, interrupts: StepInterrupts, executing: ScheduledBatch | None
    ) -> PreemptionPoints:
        """What runs at the preemption points of a step: take arrivals, run urgent prompts nested.
        executing: the urgent batch being interrupted (None: an ordinary step, any urgent prompt may)."""

        def run_urgent_arrivals() -> None:
            interrupts.poll()
            outputs = self._run_urgent(interrupts, executing)
            if outputs:
                interrupts.deliver(outputs)

        return PreemptionPoints(run_urgent_arrivals)

    def evict(self, *, abort_running: bool = False, keep_host_copy: bool = True) -> HostCopy | None:
        """Give the model's partition back to the arena, first copying its weights to host memory (pinned
        on CUDA) when keep_host_copy: the HostCopy to rebuild it from with LLMEngine(host_copy, ...), or
        None. Requests in flight refuse it (ModelBusyError) unless abort_running, which aborts them
        first (freeing their blocks; their final outputs are dropped). The engine is unusable after:
        add_request and step raise ModelEvictedError. ValueError for an engine not in an arena."""
        self._check_resident()
        if self.memory is None or self._placed is None:
            raise ValueError("only an engine built in an arena (LLMEngine(memory=...)) can be evicted")
        in_flight = self.scheduler.request_ids()
        if in_flight and not abort_running:
            raise ModelBusyError(self._placed.partition.model, len(in_flight))
        for request_id in in_flight:
            self.abort_request(request_id)
        unpack_model(self.loaded.model)  # frees the packed copies now, not with the engine's last reference
        host = evict_to_host(self.memory, self._placed, keep_host_copy=keep_host_copy)
        self._evicted = True
        self.kv.partition = None
        self._placed = None
        return host

    def _check_resident(self) -> None:
        if self._evicted:
            raise ModelEvictedError(self.model_name or "")

    def _output(self, seq: Sequence, token: int) -> RequestOutput:
        text = ""
        state = self._text.get(seq.request_id)
        if state is not None:
            text, stop = state.push(token, seq.is_finished)
            if stop is not None and not seq.is_finished:
                seq.stop_reason = stop
                self.scheduler.finish(seq, FinishReason.STOP)
        if seq.is_finished:
            self._forget(seq.request_id)
        return make_output(seq, [token], text)

    def _forget(self, request_id: str) -> None:
        self._text.pop(request_id, None)
        self.runner.sampler.release(request_id)


def _decoder_config(config: DecoderConfig | EncoderConfig, model_dir: str | Path) -> DecoderConfig:
    if not isinstance(config, DecoderConfig):
        raise InvalidRequestError("model", f"{model_dir} is an encoder; serve it with EmbeddingEngine")
    return config
