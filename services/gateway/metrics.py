"""Gateway metrics in the service's own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.common.workload import WorkloadClass


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "hanzo_gateway_requests",
            "Requests by method, workload class and final status",
            ["method", "workload_class", "code"],
            registry=r,
        )
        self.retries = Counter(
            "hanzo_gateway_retries",
            "Requests moved to another worker before their first token",
            ["workload_class"],
            registry=r,
        )
        ttft = Histogram(
            "hanzo_gateway_time_to_first_token_seconds",
            "Request arrival at the gateway to the first streamed token",
            ["workload_class"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        # Children resolved once: a labels() lookup per streamed request is measurable on the hot path.
        self.ttft: dict[WorkloadClass, Histogram] = {w: ttft.labels(w.name) for w in WorkloadClass}
        self.generated: dict[WorkloadClass, Counter] = {
            w: self.requests.labels("Generate", w.name, "OK") for w in WorkloadClass
        }
