"""RetryInfo: the delay an overloaded service asks for, written into gRPC's rich status and read back by
the gateway and by any client (grpcio-status), never parsed out of a message."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from services.common.errors import InvalidArgument, ResourceExhausted
from services.common.retry_info import (
    DETAILS_KEY,
    retry_after_from_details,
    retry_after_from_trailers,
    retry_trailers,
)
from services.worker.engine.errors import AdmissionError
from services.worker.server.error_status import worker_status


@pytest.mark.parametrize("seconds", [0.0, 0.05, 1.0, 2.25, 60.0])
def test_retry_delay_round_trips_through_the_trailer(seconds: float) -> None:
    trailers = retry_trailers(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", seconds)
    assert [key for key, _ in trailers] == [DETAILS_KEY]
    status = status_pb2.Status.FromString(trailers[0][1])  # what any grpcio-status client decodes
    assert (status.code, status.message) == (grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], "busy")
    assert status.details[0].Is(error_details_pb2.RetryInfo.DESCRIPTOR)
    assert retry_after_from_trailers(trailers) == pytest.approx(seconds, abs=1e-9)


@pytest.mark.parametrize(
    ("trailers", "expected"),
    [
        (None, None),
        ((), None),
        ((("other-bin", b"x"),), None),
        (((DETAILS_KEY, status_pb2.Status(code=8, message="no details").SerializeToString()),), None),
        (((DETAILS_KEY, b"\xff\xff not a status"),), None),  # a malformed trailer: no advice, no crash
    ],
)
def test_trailers_without_retry_info_ask_for_no_delay(trailers, expected) -> None:
    assert retry_after_from_trailers(trailers) is expected
    assert retry_after_from_details(b"") is None
    assert retry_trailers(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", None) == ()


@pytest.mark.parametrize(
    ("exc", "delay"),
    [
        (ResourceExhausted("busy", retry_after_s=2.5), 2.5),
        (ResourceExhausted("busy"), None),
        (AdmissionError("the BATCH queue is full", retry_after_s=0.4, reason=AdmissionError.QUEUE_FULL), 0.4),
        (InvalidArgument("max_tokens", "must be > 0"), None),
    ],
)
def test_refusals_carry_their_delay_beside_a_plain_message(exc: BaseException, delay: float | None) -> None:
    status = worker_status(exc)
    assert status is not None and status.retry_after_s == delay
    message = status.message
    assert "retry after" not in message  # the delay is RetryInfo's job, not the message's
