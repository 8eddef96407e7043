"""Errors that services raise on purpose; the error interceptor turns each into its gRPC status."""

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
    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        hint = f" (retry after {retry_after_s:.1f} s)" if retry_after_s is not None else ""
        super().__init__(message + hint)
        self.retry_after_s = retry_after_s


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE
