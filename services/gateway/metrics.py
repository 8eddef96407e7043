"""Gateway metrics in the service's own registry, per method and transport (gRPC or the HTTP front)."""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.common.workload import WorkloadClass

GRPC = "grpc"
HTTP = "http"


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "hanzo_gateway_requests",
            "Requests by method, workload class, final status and transport (grpc, http)",
            ["method", "workload_class", "code", "transport"],
            registry=r,
        )
        self.retries = Counter(
            "hanzo_gateway_retries",
            "Requests moved to another worker before their first token",
            ["workload_class"],
            registry=r,
        )
        self.ttft = Histogram(
            "hanzo_gateway_time_to_first_token_seconds",
            "Request arrival at the gateway to the first streamed token",
            ["workload_class", "transport"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.rate_limited = Counter(
            "hanzo_gateway_rate_limited",
            "Requests refused with RESOURCE_EXHAUSTED (HTTP 429) because their API key was over its rate",
            registry=r,
        )
        self.ejections = Counter(
            "hanzo_gateway_worker_ejections",
            "Workers left out of this gateway's picks since their link broke (died, or hung past keepalive)",
            registry=r,
        )
        self.http_responses = Counter(
            "hanzo_gateway_http_responses",
            "HTTP front responses by route and status (a stream counts once, by the status it began with)",
            ["route", "status"],
            registry=r,
        )
        self.http_in_flight = Gauge(
            "hanzo_gateway_http_requests_in_flight",
            "HTTP front requests being answered (a stream until its last event)",
            ["route"],
            registry=r,
        )
        self.http_seconds = Histogram(
            "hanzo_gateway_http_request_duration_seconds",
            "HTTP front requests from arrival to the response's end (a stream's whole life)",
            ["route", "status"],
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
            registry=r,
        )
        self.tenant_tokens = TenantTokens(r)

    def tally(self, method: str, transport: str) -> Tally:
        """The counters of one method on one transport; build once, at start."""
        return Tally(self, method, transport)


class Tally:
    """One method's counters on one transport with their children resolved once: a labels() lookup per
    streamed request is measurable on the hot path."""

    def __init__(self, metrics: GatewayMetrics, method: str, transport: str) -> None:
        self._requests = metrics.requests
        self.method = method
        self.transport = transport
        self.ok: dict[WorkloadClass, Counter] = {
            w: metrics.requests.labels(method, w.name, "OK", transport) for w in WorkloadClass
        }
        self.ttft: dict[WorkloadClass, Histogram] = {
            w: metrics.ttft.labels(w.name, transport) for w in WorkloadClass
        }
        self.retries: dict[WorkloadClass, Counter] = {
            w: metrics.retries.labels(w.name) for w in WorkloadClass
        }

    def failed(self, workload: WorkloadClass, code: grpc.StatusCode) -> None:
        """Count a request that ended with code (failures are rare: the lookup is fine here)."""
        self._requests.labels(self.method, workload.name, code.name, self.transport).inc()


class TenantTokens:
    """Prompt and generated tokens per tenant (the request's tenant, OpenAI's `user`), for usage
    accounting. Tenants are the caller's strings: past MAX_TENANTS distinct ones the rest count as
    "other", so a caller cannot grow the series without bound."""

    MAX_TENANTS = 1000

    def __init__(self, registry: CollectorRegistry) -> None:
        self._tokens = Counter(
            "hanzo_gateway_tenant_tokens",
            'Tokens by tenant ("" for none) and kind (prompt, generation)',
            ["tenant", "kind"],
            registry=registry,
        )
        self._seen: dict[str, tuple[Counter, Counter]] = {}

    def add(self, tenant: str, prompt: int, generated: int) -> None:
        children = self._seen.get(tenant)
        if children is None:
            label = tenant if len(self._seen) < self.MAX_TENANTS else "other"
            children = (self._tokens.labels(label, "prompt"), self._tokens.labels(label, "generation"))
            if label == tenant:
                self._seen[tenant] = children
        if prompt:
            children[0].inc(prompt)
        if generated:
            children[1].inc(generated)
