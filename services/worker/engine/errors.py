"""Typed engine errors; the gRPC layer maps each class to one status code."""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """The request itself is wrong (maps to INVALID_ARGUMENT). `field` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class RequestNotFoundError(EngineError, KeyError):
    """No request with that id is in flight."""


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
