"""Typed engine errors; the worker's gRPC layer maps each class to one status code
(services/worker/server/error_status.py)."""

from __future__ import annotations

from services.common.errors import InvalidArgument


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, InvalidArgument):
    """The request itself is wrong: INVALID_ARGUMENT, as every service's InvalidArgument (`field` names
    the offending input), raised by the engine."""


class EngineDeadError(EngineError, RuntimeError):
    """The engine's step thread stopped; nothing more can be served (maps to UNAVAILABLE)."""


class AdmissionError(EngineError):
    """The engine will not take this request now; maps to RESOURCE_EXHAUSTED.

    reason: QUEUE_FULL (refused at add: its class's queue is at its limit) or QUEUE_TIMEOUT (it waited
    past its class's queue timeout without being scheduled). retry_after_s: when trying again is likely
    to succeed."""

    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"

    def __init__(self, message: str, retry_after_s: float, reason: str) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason
