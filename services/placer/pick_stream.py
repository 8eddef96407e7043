"""PickStream: many picks on one long-lived call, as the gateway's GenerateStreams link to a worker.

A unary Pick pays for a call set up and torn down at both ends. On this 2-core machine that is about
0.28 ms of the placer's core per call even when Pick does nothing (bench/placer_floor.py), three times
the pick itself, and with 32 callers in flight it alone put p99 above 10 ms. On one call a pick costs
part of a message each way instead, and a busy caller sends every pick it has ready in one message
(PickCalls), which the placer answers in one (PickAnswers): the busier the caller, the fewer messages.

Each pick is answered as a Pick call would be: the same decision code, the same statuses (as
PickFailure, so one bad request does not end the call and the picks beside it), and its own SERVER span
continuing the trace context it carries, named as the unary call's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
from opentelemetry import trace

from hanzo.inference.v1 import placer_pb2
from services.common.error_status import service_status
from services.common.errors import InvalidArgument
from services.common.served import record_status, server_span
from services.common.tracing import rpc_attributes

log = logging.getLogger(__name__)

# Picks in one PickCalls message at most: they are answered in one go, on the loop that also applies
# the cluster's events, so this bounds how long one message holds it (about 256 x 0.1 ms).
MAX_CALLS = 256

_SPAN_NAME = "/hanzo.inference.v1.Placer/Pick"  # a pick reads in a trace as a Pick call does
_SPAN_ATTRIBUTES = rpc_attributes("hanzo.inference.v1.Placer", "Pick")


class PickAnswerer:
    """Answers one PickCalls message with the Pick RPC's decision code (pick: PlacerReplica.pick)."""

    def __init__(
        self, pick: Callable[[placer_pb2.PickRequest], placer_pb2.PickReply], tracer: trace.Tracer
    ) -> None:
        self.pick = pick
        self.tracer = tracer

    def answer(self, calls: placer_pb2.PickCalls) -> placer_pb2.PickAnswers:
        """Every call's answer, in the order sent; InvalidArgument for a message over MAX_CALLS (a caller
        bug: the call ends, and no pick of that message is made)."""
        if len(calls.calls) > MAX_CALLS:
            raise InvalidArgument(
                "calls", f"has {len(calls.calls)} picks in one PickCalls message; send at most {MAX_CALLS}"
            )
        return placer_pb2.PickAnswers(answers=[self._one(call) for call in calls.calls])

    def _one(self, call: placer_pb2.PickCall) -> placer_pb2.PickAnswer:
        with server_span(self.tracer, _SPAN_NAME, _SPAN_ATTRIBUTES, call.trace_context) as span:
            try:
                reply = self.pick(call.request)
            except Exception as exc:
                status = service_status(exc)
                if status is None:  # a bug: answered UNKNOWN with its text, as a Pick call would be
                    log.exception("pick %d failed", call.call_id)
                    span.record_exception(exc)
                    code, details = grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}"
                else:
                    code, details = status.code, status.message
                if span.is_recording():
                    record_status(span, code, details)
                failure = placer_pb2.PickFailure(code=code.value[0], details=details)
                return placer_pb2.PickAnswer(call_id=call.call_id, failure=failure)
            if span.is_recording():  # a tenth of the stream's time per pick when nothing records
                record_status(span, grpc.StatusCode.OK, None)
            return placer_pb2.PickAnswer(call_id=call.call_id, reply=reply)
