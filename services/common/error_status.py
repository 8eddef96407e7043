"""The gRPC status each typed exception stands for, so servicers raise and never build statuses."""

from __future__ import annotations

import grpc

from services.common.errors import ResourceExhausted, ServiceError
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


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status a raised exception stands for; None for an unexpected error (a bug: INTERNAL)."""
    if isinstance(exc, ServiceError):
        return exc.code, str(exc)
    if isinstance(exc, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, EngineDeadError):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, AdmissionError):  # its delay travels as RetryInfo: see retry_after_for
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, ChatTemplateError):  # the template's own check, e.g. roles that must alternate
        return grpc.StatusCode.INVALID_ARGUMENT, f"messages: {exc}"
    if isinstance(exc, NoChatTemplateError):  # this model cannot chat: send a plain prompt instead
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, CheckpointError):  # the files on disk are wrong; retrying will not help
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, MemoryManagerError):
        for kind, code in _MEMORY_STATUS:
            if isinstance(exc, kind):
                return code, str(exc)
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)  # bad sizes or ranges asked of the manager
    return None


def retry_after_for(exc: BaseException) -> float | None:
    """How long the caller of a refused request should wait before retrying; None: no advice."""
    if isinstance(exc, ResourceExhausted | AdmissionError):
        return exc.retry_after_s
    return None


# Every exception type status_for maps: what the served wrapper catches and answers with its status.
TYPED_ERRORS = (
    ServiceError, InvalidRequestError, EngineDeadError, AdmissionError, CheckpointError, MemoryManagerError,
    ChatTemplateError, NoChatTemplateError,
)  # fmt: skip
