"""The status a raised exception stands for, so servicers raise and never build statuses.

Each service maps its own errors: this module maps the errors every service raises on purpose
(services/common/errors.py); the worker extends it with its engine's, memory manager's and models'
(services/worker/server/error_status.py) and hands that mapper to the served wrapper and its stream
sessions. So this package knows no service."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import grpc

from services.common.errors import ResourceExhausted, ServiceError


class ErrorStatus(NamedTuple):
    """code and message of the status; retry_after_s: how long the caller should wait before trying
    again (sent as google.rpc.RetryInfo, see retry_info.py), None for no advice."""

    code: grpc.StatusCode
    message: str
    retry_after_s: float | None = None


# An exception -> the status it stands for; None for an unexpected one (a bug: answered UNKNOWN).
StatusMapper = Callable[[BaseException], ErrorStatus | None]


def service_status(exc: BaseException) -> ErrorStatus | None:
    """The status of a ServiceError; None for anything else."""
    if isinstance(exc, ServiceError):
        retry = exc.retry_after_s if isinstance(exc, ResourceExhausted) else None
        return ErrorStatus(exc.code, str(exc), retry)
    return None
