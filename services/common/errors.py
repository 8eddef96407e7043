"""Errors that services raise on purpose; the served wrapper (served.py) answers each with its status."""

from __future__ import annotations

import re

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
        super().__init__(message + retry_hint(retry_after_s))
        self.retry_after_s = retry_after_s


def retry_hint(retry_after_s: float | None) -> str:
    """The suffix every RESOURCE_EXHAUSTED message ends with, so callers parse one format; "" for None."""
    return f" (retry after {retry_after_s:.1f} s)" if retry_after_s is not None else ""


_HINT = re.compile(r" \(retry after (\d+(?:\.\d+)?) s\)$")


def split_retry_hint(message: str) -> tuple[str, float | None]:
    """(message without its retry_hint suffix, the hinted seconds); (message, None) when it has none."""
    match = _HINT.search(message)
    if match is None:
        return message, None
    return message[: match.start()], float(match.group(1))


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED
