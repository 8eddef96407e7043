"""A grpc.aio server interceptor mapping typed exceptions to status codes, so servicers stay thin."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from services.common.errors import ServiceError, retry_hint
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
from services.worker.models.errors import CheckpointError

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
    if isinstance(exc, AdmissionError):  # worded like ResourceExhausted: one hint format for callers
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc) + retry_hint(exc.retry_after_s)
    if isinstance(exc, CheckpointError):  # the files on disk are wrong; retrying will not help
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, MemoryManagerError):
        for kind, code in _MEMORY_STATUS:
            if isinstance(exc, kind):
                return code, str(exc)
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)  # bad sizes or ranges asked of the manager
    return None


_TYPED = (
    ServiceError, InvalidRequestError, EngineDeadError, AdmissionError, CheckpointError, MemoryManagerError
)  # fmt: skip


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    mapped = status_for(exc)
    assert mapped is not None  # only typed errors are caught
    await context.abort(*mapped)


def _wrap_unary(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except _TYPED as exc:
            await _abort(context, exc)

    return handler


def _wrap_stream(behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in behavior(request, context):
                yield item
        except _TYPED as exc:
            await _abort(context, exc)

    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every handler: a typed error becomes its status; anything else is left to gRPC (INTERNAL)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary), handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary(handler.stream_unary), handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream), handler.request_deserializer, handler.response_serializer
            )
        return grpc.stream_stream_rpc_method_handler(
            _wrap_stream(handler.stream_stream), handler.request_deserializer, handler.response_serializer
        )
