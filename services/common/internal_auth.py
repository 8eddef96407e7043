"""The mesh's internal credential: a token shared by its services (HANZO_INTERNAL_TOKEN, the same value in
every one), sent on each call one service makes to another and required by the internal servers (the
worker's and the placer's services), so that reaching a port is not enough to load or evict models,
generate on a worker, or feed the placer heartbeats and telemetry. Health and reflection stay open for
probes. Compared in constant time; a refused call gets UNAUTHENTICATED and is logged.

Unset, internal RPCs are open and each server says so once at start: single-process tests and a
developer's own processes run that way. `hanzo-mesh up` and `serve` generate one per run.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Mapping

from services.common.errors import Unauthenticated

log = logging.getLogger(__name__)

ENV = "HANZO_INTERNAL_TOKEN"
HEADER = "x-hanzo-internal-token"
Metadata = tuple[tuple[str, str], ...]


def token_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """The internal token, or None where it is unset or blank."""
    return environ.get(ENV, "").strip() or None


def call_metadata(token: str | None) -> Metadata:
    """The metadata a client adds to each internal call: the token, or nothing without one."""
    return ((HEADER, token),) if token else ()


class InternalToken:
    """An Authenticate (services/common/served.py) for internal servers: the call's HEADER must be the
    token."""

    def __init__(self, token: str, service: str) -> None:
        self._token = token.encode()
        self.service = service

    def __call__(self, metadata: Mapping[str, str]) -> None:
        offered = metadata.get(HEADER, "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(offered, self._token):
            log.warning(
                "%s refused an internal call %s",
                self.service,
                "with a wrong token" if offered else "without a token",
            )
            raise Unauthenticated(f"internal RPC: send the mesh's internal token in `{HEADER}` ({ENV})")


def server_check(token: str | None, service: str) -> InternalToken | None:
    """The check an internal server applies to every call, or None (open, and said once) without a token."""
    if token is None:
        log.warning("%s: no %s set, internal RPCs are open to anyone who reaches the port", service, ENV)
        return None
    return InternalToken(token, service)
