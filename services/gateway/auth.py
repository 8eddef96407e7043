"""API-key authentication: `authorization: Bearer <key>` against the configured keys (gRPC metadata and
the HTTP front's headers alike)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from services.common.errors import Unauthenticated


class ApiKeys:
    """Called with each call's metadata (or an HTTP request's headers, any mapping with lower-case
    `authorization`) before its handler runs; returns the key it carries (the caller's identity, for
    rate limits), or raises Unauthenticated saying what is wrong with it."""

    def __init__(self, keys: frozenset[str]) -> None:
        self.keys = keys
        # Bytes: compare_digest refuses str with non-ASCII characters, which an HTTP header may carry.
        self._known = tuple(k.encode() for k in keys)

    def __call__(self, metadata: Mapping[str, str]) -> bytes:
        header = metadata.get("authorization", "")
        if not header:
            raise Unauthenticated("missing `authorization: Bearer <key>`")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthenticated("authorization must be `Bearer <key>`")
        offered = key.strip().encode("utf-8", "surrogateescape")
        # Constant time: every key is compared (no early exit on a match), each in constant time, so
        # timing reveals neither a matching prefix nor which key matched.
        matched = False
        for known in self._known:
            matched |= hmac.compare_digest(offered, known)
        if not matched:
            raise Unauthenticated("unknown API key")
        return offered
