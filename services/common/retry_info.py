"""How long an overloaded service asks its caller to wait, as gRPC's rich error model carries it: a
`google.rpc.Status` with a `google.rpc.RetryInfo` detail in the `grpc-status-details-bin` trailer
(grpcio-status). Google's client libraries and Envoy read the delay from there, so it never has to be
parsed out of a message. The HTTP front turns the same delay into `Retry-After`."""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

DETAILS_KEY = rpc_status.GRPC_DETAILS_METADATA_KEY

Trailers = tuple[tuple[str, bytes], ...]


def status_details(code: grpc.StatusCode, message: str, retry_after_s: float) -> bytes:
    """The serialized google.rpc.Status of an error whose caller should retry after retry_after_s."""
    info = error_details_pb2.RetryInfo()
    info.retry_delay.FromNanoseconds(max(0, round(retry_after_s * 1e9)))
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(code=code.value[0], message=message, details=[detail]).SerializeToString()


def retry_trailers(code: grpc.StatusCode, message: str, retry_after_s: float | None) -> Trailers:
    """The trailing metadata that carries retry_after_s to the caller; empty for None."""
    if retry_after_s is None:
        return ()
    return ((DETAILS_KEY, status_details(code, message, retry_after_s)),)


def retry_after_from_details(details: bytes) -> float | None:
    """The RetryInfo delay inside a serialized google.rpc.Status; None when it carries none, or is not
    one (a peer's malformed trailer must not turn its refusal into a bug of ours)."""
    if not details:
        return None
    try:
        status = status_pb2.Status.FromString(details)
    except DecodeError:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.ToNanoseconds() / 1e9
    return None


def retry_after_from_trailers(metadata: Iterable[tuple[str, str | bytes]] | None) -> float | None:
    """The delay a failed call's trailing metadata asks for; None when it asks for none."""
    for key, value in metadata or ():
        if key == DETAILS_KEY and isinstance(value, bytes):
            return retry_after_from_details(value)
    return None


def retry_after_of(error: grpc.RpcError) -> float | None:
    """The delay a failed call (grpc.aio.AioRpcError, or a sync client's error) asks for."""
    trailing = getattr(error, "trailing_metadata", None)
    return retry_after_from_trailers(trailing() if callable(trailing) else None)
