"""What the caller's side of a long-lived multiplexing call (Worker.GenerateStreams, Placer.PickStream)
needs: reading its messages until it ends, and the error each call it carries would have raised, so
their callers handle it exactly as they would a failed call of their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from services.common.retry_info import DETAILS_KEY

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def status_code(value: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a status carried as its number (UNKNOWN for a number gRPC does not know)."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


def rpc_error(
    code: grpc.StatusCode,
    details: str,
    status_details: bytes = b"",
    kind: type[grpc.aio.AioRpcError] = grpc.aio.AioRpcError,
) -> grpc.aio.AioRpcError:
    """The error a call would have raised, its rich status (RetryInfo) in the trailers when given."""
    trailing = grpc.aio.Metadata((DETAILS_KEY, status_details)) if status_details else grpc.aio.Metadata()
    return kind(code, grpc.aio.Metadata(), trailing, details)


async def read_until_ended(call: grpc.aio.StreamStreamCall, deliver: Callable[[Any], None], eof: str) -> str:
    """Hand every message of call to deliver until the call ends; why it ended (eof: the peer ended it
    with OK)."""
    try:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return eof
            deliver(message)
    except grpc.aio.AioRpcError as failed:
        return f"{failed.code().name}: {failed.details()}"
