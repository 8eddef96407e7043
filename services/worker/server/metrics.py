"""Worker metrics, named and labelled after vLLM's (vllm:time_to_first_token_seconds{model_name} ->
hanzo_worker_time_to_first_token_seconds{model_name}) so a vLLM dashboard's queries carry over with the
prefix swapped (deploy/SERVICES.md has the table); most also carry the workload class."""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.common.workload import WorkloadClass
from services.worker.engine.llm_engine import LLMEngine
from services.worker.server.host import ModelHost, ServedModel
from services.worker.server.iteration_metrics import IterationTokens

_K = TypeVar("_K", bound=Hashable)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)
# vLLM's 1-2-5 series of request lengths, up to a long context.
_LENGTH_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5) if m * 10**e <= 200_000)


class WorkerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["model_name", "workload_class"]
        self.ttft = Histogram(
            "hanzo_worker_time_to_first_token_seconds",
            "Arrival to first token (vllm:time_to_first_token_seconds)",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "hanzo_worker_inter_token_latency_seconds",
            "Between streamed tokens (vllm:inter_token_latency_seconds)",
            labels,
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "hanzo_worker_e2e_request_latency_seconds",
            "Arrival to finish (vllm:e2e_request_latency_seconds)",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "hanzo_worker_request_queue_time_seconds",
            "Arrival to first schedule (vllm:request_queue_time_seconds)",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "hanzo_worker_requests",
            "Finished requests (vllm:request_success_total)",
            [*labels, "finish_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "hanzo_worker_prompt_tokens",
            "Prompt tokens (vllm:prompt_tokens_total)",
            ["model_name"],
            registry=r,
        )
        self.generation_tokens = Counter(
            "hanzo_worker_generation_tokens",
            "Generated tokens (vllm:generation_tokens_total)",
            ["model_name"],
            registry=r,
        )
        self.running = Gauge(
            "hanzo_worker_num_requests_running",
            "Sequences running (vllm:num_requests_running)",
            ["model_name"],
            registry=r,
        )
        self.waiting = Gauge(
            "hanzo_worker_num_requests_waiting",
            "Sequences queued (vllm:num_requests_waiting)",
            ["model_name"],
            registry=r,
        )
        self.arena_bytes = Gauge(
            "hanzo_worker_arena_bytes",
            "The memory arena reserved at start: state total, free (in no partition) or host_copies "
            "(weights of evicted models kept in host memory for a fast reload)",
            ["state"],
            registry=r,
        )
        self.model_bytes = Gauge(
            "hanzo_worker_model_bytes",
            "Arena bytes a resident model holds, by part (weights, kv)",
            ["model_name", "part"],
            registry=r,
        )
        self.evictions = Counter(
            "hanzo_worker_model_evictions",
            "Models evicted: reason request (EvictModel or a placer directive) or lru (to make room)",
            ["reason"],
            registry=r,
        )
        self.kv_usage = Gauge(
            "hanzo_worker_kv_cache_usage_ratio",
            "KV blocks in use, 0-1 (vllm:kv_cache_usage_perc)",
            ["model_name"],
            registry=r,
        )
        self.prefix_queries = Counter(
            "hanzo_worker_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache (vllm:prefix_cache_queries_total)",
            ["model_name"],
            registry=r,
        )
        self.prefix_hits = Counter(
            "hanzo_worker_prefix_cache_hits",
            "Prompt tokens found in the prefix cache (vllm:prefix_cache_hits_total)",
            ["model_name"],
            registry=r,
        )
        self.request_prompt_tokens = Histogram(
            "hanzo_worker_request_prompt_tokens",
            "Prompt tokens per finished request (vllm:request_prompt_tokens)",
            labels,
            buckets=_LENGTH_BUCKETS,
            registry=r,
        )
        self.request_generation_tokens = Histogram(
            "hanzo_worker_request_generation_tokens",
            "Generated tokens per finished request (vllm:request_generation_tokens)",
            labels,
            buckets=_LENGTH_BUCKETS,
            registry=r,
        )
        self.prefill_time = Histogram(
            "hanzo_worker_request_prefill_time_seconds",
            "First schedule to first token (vllm:request_prefill_time_seconds)",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decode_time = Histogram(
            "hanzo_worker_request_decode_time_seconds",
            "First token to finish (vllm:request_decode_time_seconds)",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_time = Histogram(
            "hanzo_worker_request_inference_time_seconds",
            "First schedule to finish (vllm:request_inference_time_seconds)",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.preemptions = Counter(
            "hanzo_worker_num_preemptions",
            "Sequences preempted, by the preempted one's class (vllm:num_preemptions_total)",
            labels,
            registry=r,
        )
        self.rejected = Counter(
            "hanzo_worker_requests_rejected",
            "Generate calls refused with RESOURCE_EXHAUSTED: reason queue_full (a class queue or the "
            "worker's max_waiting was full at arrival) or queue_timeout (not scheduled within the class's "
            "queue timeout)",
            [*labels, "reason"],
            registry=r,
        )
        self.step_budget = Gauge(
            "hanzo_worker_step_token_budget",
            "Token budget the scheduling policy chose for the latest engine step",
            ["model_name"],
            registry=r,
        )
        self.steps = Counter(
            "hanzo_worker_engine_steps",
            "Engine steps run, by the token budget chosen for them",
            ["model_name", "budget"],
            registry=r,
        )
        self.urgent_steps = Counter(
            "hanzo_worker_urgent_steps",
            "Steps of latency-class prompts run ahead of, or between the blocks of, a running step "
            "(layer-level preemption)",
            ["model_name"],
            registry=r,
        )
        self.iteration_tokens = IterationTokens(r)
        self.heartbeats = Counter(
            "hanzo_worker_heartbeats",
            "Heartbeats to the placer by outcome: delivered, or failed (placer unreachable or refusing)",
            ["outcome"],
            registry=r,
        )
        self.last_heartbeat = Gauge(
            "hanzo_worker_last_heartbeat_timestamp_seconds",
            "Unix time of the last heartbeat the placer took (0 before the first); the placer drops a "
            "worker whose heartbeats stop for three intervals",
            registry=r,
        )
        # Engine counters are cumulative per engine; a reloaded model is a new engine starting at zero.
        self._seen: weakref.WeakKeyDictionary[LLMEngine, _Exported] = weakref.WeakKeyDictionary()
        self._evictions_exported: dict[str, int] = {}

    def heartbeat(self, delivered: bool) -> None:
        """Count one heartbeat; a delivered one is the worker's last sign of life in the placer."""
        self.heartbeats.labels("delivered" if delivered else "failed").inc()
        if delivered:
            self.last_heartbeat.set_to_current_time()

    def refresh_memory(self, host: ModelHost) -> None:
        """The arena's bytes and each resident model's share, from the memory manager's accounting."""
        for reason, count in host.evictions.items():
            gained = count - self._evictions_exported.get(reason, 0)
            if gained > 0:
                self.evictions.labels(reason).inc(gained)
                self._evictions_exported[reason] = count
        if host.memory is None:
            return
        self.arena_bytes.labels("total").set(host.memory.arena.total_bytes)
        self.arena_bytes.labels("free").set(host.memory.free_bytes)
        self.arena_bytes.labels("host_copies").set(sum(c.nbytes for c in host.host_copies.values()))
        self.model_bytes.clear()  # evicted models drop out
        for model, usage in host.memory.usage().items():
            self.model_bytes.labels(model, "weights").set(usage.weight_bytes)
            self.model_bytes.labels(model, "kv").set(usage.kv_bytes)

    def refresh(self, models: Iterable[ServedModel]) -> None:
        """Copy engine state into the metrics: load gauges as they are now, the engine's cumulative
        counters by what they gained since the last refresh. Cheap reads; call from the event loop."""
        for served in models:
            if served.llm is None:
                continue
            name = served.name
            snap = served.snapshot  # the engine thread's, published after its last step
            self.running.labels(name).set(snap.running)
            self.waiting.labels(name).set(snap.waiting)
            self.kv_usage.labels(name).set(snap.kv_usage)
            if snap.steps:  # before the first step there is no budget to report
                self.step_budget.labels(name).set(snap.last_budget)
            exported = self._seen.setdefault(served.llm.engine, _Exported())
            for workload, gained in _gained(snap.preemptions_by_class, exported.preemptions):
                self.preemptions.labels(name, workload.name).inc(gained)
            for budget, gained in _gained(snap.steps_by_budget, exported.steps):
                self.steps.labels(name, str(budget)).inc(gained)
            for _, gained in _gained({"urgent": snap.urgent_steps}, exported.urgent_steps):
                self.urgent_steps.labels(name).inc(gained)
            by_tokens = dict(_gained(snap.steps_by_tokens, exported.steps_by_tokens))
            if by_tokens:
                tokens = dict(_gained({"tokens": snap.tokens_computed}, exported.tokens_computed))
                self.iteration_tokens.add(name, by_tokens, tokens.get("tokens", 0))


@dataclass
class _Exported:
    """One engine's cumulative counters as last added to the metrics."""

    preemptions: dict[WorkloadClass, int] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)
    urgent_steps: dict[str, int] = field(default_factory=dict)
    steps_by_tokens: dict[int, int] = field(default_factory=dict)
    tokens_computed: dict[str, int] = field(default_factory=dict)


def _gained(now: Mapping[_K, int], exported: dict[_K, int]) -> Iterator[tuple[_K, int]]:
    """(key, increase) for each key of a cumulative counter that grew since `exported`, which it updates."""
    for key, value in now.items():
        increase = value - exported.get(key, 0)
        if increase > 0:
            exported[key] = value
            yield key, increase
