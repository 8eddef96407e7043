"""OpenTelemetry's GenAI semantic conventions for the mesh's inference spans: one span per request,
named `{gen_ai.operation.name} {gen_ai.request.model}` (`chat llama`, `text_completion llama`,
`embeddings minilm`), with the request's sampling settings, the response's id, finish reasons and
token usage, so a GenAI-aware trace UI reads a request the way it reads one to any provider.

The gateway's span (router.py) is INTERNAL, a child of the transport's SERVER span (the gRPC method's
or the HTTP front's); the worker's SERVER span carries the same request attributes and the engine's
phases. Attributes with their specification's names: gen_ai.* (GenAI), error.type; the mesh's own
under hanzo.*.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import trace

from hanzo.inference.v1 import inference_pb2
from services.common.errors import ServiceError
from services.common.workload import WorkloadClass

# gen_ai.provider.name: the specification lists hosted providers; a self-hosted server names itself.
PROVIDER = "hanzo"
CHAT = "chat"
TEXT_COMPLETION = "text_completion"
EMBEDDINGS = "embeddings"
FINISH_REASONS = {
    inference_pb2.FINISH_REASON_STOP: "stop",
    inference_pb2.FINISH_REASON_LENGTH: "length",
    inference_pb2.FINISH_REASON_ABORT: "abort",
    inference_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}
DEFAULT_MAX_TOKENS = 16  # SamplingParams.max_tokens unset (the proto's comment)


def span_name(operation: str, model: str) -> str:
    return f"{operation} {model}"


def operation_of(request: inference_pb2.GenerateRequest) -> str:
    """chat for chat input (Chat, /v1/chat/completions), else text_completion."""
    return CHAT if request.WhichOneof("input") == "chat" else TEXT_COMPLETION


def request_attributes(
    operation: str, model: str, workload: WorkloadClass, sampling: inference_pb2.SamplingParams | None = None
) -> dict[str, object]:
    """The attributes known when a request arrives: what was asked, with the sampling settings in
    effect (an unset temperature or top_p is 1.0, as the engine applies them)."""
    attributes: dict[str, object] = {
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model,
        "hanzo.workload_class": workload.name,
    }
    if sampling is None:
        return attributes
    has = sampling.HasField
    attributes["gen_ai.request.temperature"] = sampling.temperature if has("temperature") else 1.0
    attributes["gen_ai.request.top_p"] = sampling.top_p if has("top_p") else 1.0
    attributes["gen_ai.request.max_tokens"] = sampling.max_tokens if has("max_tokens") else DEFAULT_MAX_TOKENS
    if sampling.top_k:
        attributes["gen_ai.request.top_k"] = sampling.top_k
    if has("seed"):
        attributes["gen_ai.request.seed"] = sampling.seed
    if sampling.n > 1:  # the specification: set only when not 1
        attributes["gen_ai.request.choice.count"] = sampling.n
    if sampling.stop:
        attributes["gen_ai.request.stop_sequences"] = list(sampling.stop)
    if sampling.presence_penalty:
        attributes["gen_ai.request.presence_penalty"] = sampling.presence_penalty
    if sampling.frequency_penalty:
        attributes["gen_ai.request.frequency_penalty"] = sampling.frequency_penalty
    return attributes


def response_attributes(
    response_id: str, model: str, finish_reasons: Iterable[str], input_tokens: int, output_tokens: int
) -> dict[str, object]:
    """The attributes of an answered request (finish reasons in choice order)."""
    return {
        "gen_ai.response.id": response_id,
        "gen_ai.response.model": model,
        "gen_ai.response.finish_reasons": list(finish_reasons),
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
    }


def record_failure(span: trace.Span, exc: BaseException) -> None:
    """Mark span failed with error.type: the status code's name for the mesh's typed errors (what the
    caller got), `cancelled` for a caller that went away, else the exception's class."""
    if isinstance(exc, ServiceError):
        kind = exc.code.name
    elif isinstance(exc, GeneratorExit) or type(exc).__name__ == "CancelledError":
        kind = "cancelled"
    else:
        kind = type(exc).__qualname__
    span.set_attribute("error.type", kind)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{kind}: {exc}" if str(exc) else kind))


class GenerateOutcome:
    """What a streamed generation returned, gathered response by response for the span's attributes."""

    __slots__ = ("first_token_seen", "input_tokens", "output_tokens", "reasons")

    def __init__(self) -> None:
        self.reasons: dict[int, str] = {}
        self.input_tokens = 0
        self.output_tokens = 0
        self.first_token_seen = False

    def observe(self, response: inference_pb2.GenerateResponse) -> bool:
        """Take one response; True for the request's first (its time to first token)."""
        first = not self.first_token_seen
        self.first_token_seen = True
        if response.finish_reason:
            self.reasons[response.index] = FINISH_REASONS.get(response.finish_reason, "abort")
            if response.index == 0:  # the prompt once per request, not per choice
                self.input_tokens = response.usage.prompt_tokens
            self.output_tokens += response.usage.completion_tokens
        return first

    def attributes(self, response_id: str, model: str) -> dict[str, object]:
        reasons = [self.reasons[i] for i in sorted(self.reasons)]
        return response_attributes(response_id, model, reasons, self.input_tokens, self.output_tokens)
