"""Errors that services raise on purpose; the served wrapper (served.py) answers each with its status."""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """Base: a failure with a status code and a message a person can act on."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(ServiceError):
    """Overloaded or over a limit; retry_after_s reaches the caller as google.rpc.RetryInfo (gRPC) or
    Retry-After (HTTP), see retry_info.py."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED
