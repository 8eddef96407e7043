"""The worker's errors as statuses: its engine's, memory manager's and models' typed errors, besides
the ServiceErrors every service raises (services/common/error_status.py)."""

from __future__ import annotations

import grpc

from services.common.error_status import ErrorStatus, service_status
from services.worker.engine.errors import AdmissionError, EngineDeadError, InvalidRequestError
from services.worker.memory.errors import (
    HostCopyMismatchError,
    MemoryManagerError,
    ModelAlreadyResidentError,
    ModelBusyError,
    ModelEvictedError,
    OutOfMemoryError,
    UnknownModelError,
)
from services.worker.models.errors import ChatTemplateError, CheckpointError, NoChatTemplateError

# Memory-manager errors by class; the first match wins, so subclasses come before their bases.
_MEMORY_STATUS: tuple[tuple[type[MemoryManagerError], grpc.StatusCode], ...] = (
    (OutOfMemoryError, grpc.StatusCode.RESOURCE_EXHAUSTED),  # the arena is full even after eviction
    (UnknownModelError, grpc.StatusCode.NOT_FOUND),
    (ModelAlreadyResidentError, grpc.StatusCode.ALREADY_EXISTS),
    (ModelBusyError, grpc.StatusCode.FAILED_PRECONDITION),  # evict with force, or wait for it to drain
    (ModelEvictedError, grpc.StatusCode.UNAVAILABLE),  # it left this worker: another may serve it
    (HostCopyMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
)


def worker_status(exc: BaseException) -> ErrorStatus | None:
    """The status a worker's raised exception stands for; None for an unexpected error (a bug)."""
    common = service_status(exc)
    if common is not None:
        return common
    if isinstance(exc, InvalidRequestError):
        return ErrorStatus(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, EngineDeadError):
        return ErrorStatus(grpc.StatusCode.UNAVAILABLE, str(exc))
    if isinstance(exc, AdmissionError):  # its delay travels as RetryInfo
        return ErrorStatus(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), exc.retry_after_s)
    if isinstance(exc, ChatTemplateError):  # the template's own check, e.g. roles that must alternate
        return ErrorStatus(grpc.StatusCode.INVALID_ARGUMENT, f"messages: {exc}")
    if isinstance(exc, NoChatTemplateError):  # this model cannot chat: send a plain prompt instead
        return ErrorStatus(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, CheckpointError):  # the files on disk are wrong; retrying will not help
        return ErrorStatus(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, MemoryManagerError):
        for kind, code in _MEMORY_STATUS:
            if isinstance(exc, kind):
                return ErrorStatus(code, str(exc))
        return ErrorStatus(grpc.StatusCode.INVALID_ARGUMENT, str(exc))  # bad sizes or ranges asked of it
    return None
