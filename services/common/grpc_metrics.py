"""Every call a gRPC service answers, counted by outcome, in the names of the grpc-ecosystem's
go-grpc-prometheus and py-grpc-prometheus (`grpc_server_started_total`, `grpc_server_handled_total`,
`grpc_server_handling_seconds`), so existing gRPC dashboards read the mesh's services unchanged. The
served wrapper (served.py) reports each call, those refused before any work included: a bad API key,
bad input, an unknown model, no worker to serve it."""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LABELS = ("grpc_service", "grpc_method", "grpc_type")
# A call's whole life: a unary pick in microseconds to a long generation streaming for minutes.
_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class GrpcServerMetrics:
    """Started / handled / in-flight / handling time per method, in registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.started = Counter(
            "grpc_server_started", "RPCs started on the server", _LABELS, registry=registry
        )
        self.handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, by status code (refusals before any work included)",
            (*_LABELS, "grpc_code"),
            registry=registry,
        )
        self.in_flight = Gauge(
            "grpc_server_in_flight", "RPCs started and not yet completed", _LABELS, registry=registry
        )
        self.seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time from an RPC's start to its status (a stream's whole life)",
            _LABELS,
            buckets=_BUCKETS,
            registry=registry,
        )

    def method(self, service: str, method: str, streaming: bool) -> MethodMetrics:
        """One method's children, resolved once (labels() is a locked lookup; calls are the hot path)."""
        return MethodMetrics(self, (service, method, "server_stream" if streaming else "unary"))


class MethodMetrics:
    """What the served wrapper calls at a call's start and end."""

    def __init__(self, metrics: GrpcServerMetrics, labels: tuple[str, str, str]) -> None:
        self._handled = metrics.handled
        self._labels = labels
        self._started = metrics.started.labels(*labels)
        self._in_flight = metrics.in_flight.labels(*labels)
        self._seconds = metrics.seconds.labels(*labels)
        self._ok = metrics.handled.labels(*labels, grpc.StatusCode.OK.name)

    def begin(self) -> None:
        self._started.inc()
        self._in_flight.inc()

    def end(self, code: grpc.StatusCode, seconds: float) -> None:
        self._in_flight.dec()
        self._seconds.observe(seconds)
        counter = self._ok if code is grpc.StatusCode.OK else self._handled.labels(*self._labels, code.name)
        counter.inc()
