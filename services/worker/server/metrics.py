"""Worker metrics, named after vLLM's (vllm:time_to_first_token_seconds -> hanzo_worker_..._seconds)
so dashboards carry over; labelled by model and workload class."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)


class WorkerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["model", "workload_class"]
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
            "hanzo_worker_prompt_tokens", "Prompt tokens (vllm:prompt_tokens_total)", ["model"], registry=r
        )
        self.generation_tokens = Counter(
            "hanzo_worker_generation_tokens",
            "Generated tokens (vllm:generation_tokens_total)",
            ["model"],
            registry=r,
        )
        self.running = Gauge(
            "hanzo_worker_num_requests_running",
            "Sequences running (vllm:num_requests_running)",
            ["model"],
            registry=r,
        )
        self.waiting = Gauge(
            "hanzo_worker_num_requests_waiting",
            "Sequences queued (vllm:num_requests_waiting)",
            ["model"],
            registry=r,
        )
        self.kv_usage = Gauge(
            "hanzo_worker_kv_cache_usage_ratio",
            "KV blocks in use, 0-1 (vllm:kv_cache_usage_perc)",
            ["model"],
            registry=r,
        )
        self.prefix_hits = Gauge(
            "hanzo_worker_prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache",
            ["model"],
            registry=r,
        )
