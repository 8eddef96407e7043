"""Errors of the HTTP front in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with
the HTTP status OpenAI (or vLLM) answers the same failure with. The request path raises typed errors
with gRPC status codes (services.common.errors); this maps them once, for replies and stream events."""

from __future__ import annotations

import json
import logging
import math
import re

import grpc
from pydantic import ValidationError

from services.common.error_status import service_status

log = logging.getLogger(__name__)

# status code -> (HTTP status, OpenAI error type, code); FAILED_PRECONDITION is a model that cannot do
# what was asked (no chat template): OpenAI answers such requests with 400.
_STATUS: dict[grpc.StatusCode, tuple[int, str, str | None]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error", None),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error", "unsupported_model"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error", "invalid_api_key"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error", None),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "invalid_request_error", None),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "rate_limit_exceeded"),
    grpc.StatusCode.CANCELLED: (499, "invalid_request_error", "cancelled"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "server_error", None),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error", "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error", "timeout"),
}
_SERVER_ERROR = (500, "server_error", None)
# A worker's refusal relayed by the gateway reads "worker NODE: FIELD: message".
_RELAYED_FIELD = re.compile(r"^worker [^:]+: ([A-Za-z_][\w.\[\]-]*): ")
_CONTEXT_LENGTH = re.compile(r"no room to (generate|reply)")
# The proto's field names where OpenAI's differ.
_RENAMES = (
    (re.compile(r"^prompt_token_ids"), "prompt"),
    (re.compile(r"^inputs"), "input"),
    (re.compile(r"^structured_output"), "response_format"),
    (re.compile(r"^(tools\[\d+\])\.parameters_json"), r"\1.function.parameters"),
    (re.compile(r"^(tools\[\d+\]|messages\[\d+\]\.tool_calls\[\d+\])\.name"), r"\1.function.name"),
)
_UNION_TAG = re.compile(r"[\[\]-]")  # pydantic names a union member in loc, e.g. "list[int]"


class HttpError(Exception):
    """One failed HTTP request: status, OpenAI error fields and extra headers (Retry-After)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def json(self) -> str:
        return json.dumps(self.body(), separators=(",", ":"))


def invalid(param: str, message: str, code: str | None = None) -> HttpError:
    """A 400 naming the offending field, worded as the gRPC path words InvalidArgument."""
    return HttpError(400, f"{param}: {message}", param=param, code=code)


def from_exception(exc: BaseException) -> HttpError:
    """The HTTP error for whatever the request path raised; a bug (untyped) is a 500 and is logged."""
    if isinstance(exc, HttpError):
        return exc
    mapped = service_status(exc)
    if mapped is None:
        log.error("HTTP request failed unexpectedly", exc_info=exc)
        return HttpError(500, f"{type(exc).__name__}: {exc}", "server_error")
    code, message, hinted = mapped
    status, type_, error_code = _STATUS.get(code, _SERVER_ERROR)
    headers: dict[str, str] = {}
    param = getattr(exc, "field", None)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        if param is None:
            relayed = _RELAYED_FIELD.match(message)
            param = relayed.group(1) if relayed else None
        if _CONTEXT_LENGTH.search(message):
            error_code = "context_length_exceeded"
    elif code == grpc.StatusCode.NOT_FOUND:
        param = "model"
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and hinted is not None:
        # Retry-After is whole seconds (RFC 9110); OpenAI's SDKs read the exact hint from -ms first.
        headers = {
            "retry-after": str(max(1, math.ceil(hinted))),
            "retry-after-ms": str(int(hinted * 1000)),
        }
    return HttpError(status, message, type_, _openai_param(param), error_code, headers)


def from_validation(error: ValidationError) -> HttpError:
    """A 400 for a body pydantic refused, naming the first offending field (not FastAPI's 422 list)."""
    first = error.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return HttpError(400, f"the body is not valid JSON: {first['msg']}", code="invalid_json")
    param = _loc_param(first["loc"])
    if param is None:
        return HttpError(400, f"the body must be a JSON object: {first['msg']}")
    return invalid(param, first["msg"].lower() if first["type"] == "missing" else first["msg"])


def _loc_param(loc: tuple[int | str, ...]) -> str | None:
    """("messages", 0, "content") -> "messages[0].content", skipping pydantic's union member tags."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif _UNION_TAG.search(part) or part in ("str", "int", "float", "bool"):
            continue
        else:
            param += f".{part}" if param else part
    return param or None


def _openai_param(param: str | None) -> str | None:
    if param is None:
        return None
    for pattern, replacement in _RENAMES:
        param = pattern.sub(replacement, param)
    return param
