"""API-key authentication: `authorization: Bearer <key>` against the configured keys."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

import grpc

# Probes and tools (grpcurl) must work without a key.
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _reject(message: str) -> grpc.RpcMethodHandler:
    async def abort(request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(abort)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without a valid key before any handler runs."""

    def __init__(self, keys: frozenset[str]) -> None:
        self.keys = keys

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if handler_call_details.method.startswith(_OPEN_PREFIXES):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        header = metadata.get("authorization", "")
        if not header:
            return _reject("missing `authorization: Bearer <key>` metadata")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key:
            return _reject("authorization must be `Bearer <key>`")
        # Constant-time comparison against every key, so timing does not reveal a prefix.
        if not any(hmac.compare_digest(key.strip(), known) for known in self.keys):
            return _reject("unknown API key")
        return await continuation(handler_call_details)
