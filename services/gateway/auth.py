"""API-key authentication: `authorization: Bearer <key>` against the configured keys."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from services.common.errors import Unauthenticated


class ApiKeys:
    """Called with each call's metadata before its handler runs; raises Unauthenticated saying what is
    wrong with the caller's header."""

    def __init__(self, keys: frozenset[str]) -> None:
        self.keys = keys

    def __call__(self, metadata: Mapping[str, str]) -> None:
        header = metadata.get("authorization", "")
        if not header:
            raise Unauthenticated("missing `authorization: Bearer <key>` metadata")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key:
            raise Unauthenticated("authorization must be `Bearer <key>`")
        # Constant-time comparison against every key, so timing does not reveal a prefix.
        if not any(hmac.compare_digest(key.strip(), known) for known in self.keys):
            raise Unauthenticated("unknown API key")
