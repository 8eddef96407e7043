"""Assign each request a workload class: explicit field > `x-hanzo-workload` metadata > heuristics.

One classifier for every route: Generate, Chat (converted to a GenerateRequest with chat input first)
and the HTTP front (its header passed as the metadata)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from hanzo.inference.v1 import inference_pb2
from services.common.errors import InvalidArgument
from services.common.workload import WorkloadClass

METADATA_KEY = "x-hanzo-workload"

# Markers agent frameworks put in tool-calling prompts (OpenAI/Hermes/Llama 3.1 styles).
_TOOL_MARKERS = re.compile(
    r"<tool_call>|<\|python_tag\|>|\"tool_calls\"|<tools>|\bfunction_call\b|Action Input:"
)
# Past these sizes a request is a document job, not a conversation turn.
_BATCH_PROMPT_CHARS = 8000
_BATCH_PROMPT_TOKENS = 2000
_BATCH_MAX_TOKENS = 1024
_AGENT_MAX_TOKENS = 64


def classify_generate(
    request: inference_pb2.GenerateRequest, metadata: Iterable[tuple[str, str]] | None
) -> WorkloadClass:
    """The class a Generate (or Chat) request is served as; InvalidArgument for an unknown class name in
    metadata. metadata: the call's invocation metadata as gRPC gives it (read only when the field is
    unset)."""
    if request.workload_class:
        try:
            explicit = WorkloadClass(request.workload_class)
        except ValueError:
            raise InvalidArgument("workload_class", f"unknown value {request.workload_class}") from None
        if explicit is WorkloadClass.EMBEDDING:
            raise InvalidArgument(
                "workload_class", "EMBEDDING is for Embed; Generate takes the other classes"
            )
        return explicit
    named = next((value for key, value in metadata or () if key == METADATA_KEY), None)
    if named:
        return from_name(named)
    return _heuristic(request)


def from_name(name: str, field: str = METADATA_KEY) -> WorkloadClass:
    """The class named (any case, e.g. "agent_tool"); InvalidArgument naming field for an unknown name."""
    try:
        return WorkloadClass[name.strip().upper()]
    except KeyError:
        allowed = ", ".join(c.name.lower() for c in WorkloadClass if c is not WorkloadClass.UNSPECIFIED)
        raise InvalidArgument(field, f"unknown workload {name!r}; use one of {allowed}") from None


def _heuristic(request: inference_pb2.GenerateRequest) -> WorkloadClass:
    """Tool-call markers (in a chat: tools offered, tool results or calls in the conversation) or a
    short capped answer -> AGENT_TOOL; a very long prompt or a long output budget -> BATCH; anything
    else is a conversation -> REALTIME_CHAT."""
    sampling = request.sampling
    max_tokens = sampling.max_tokens if sampling.HasField("max_tokens") else None
    which = request.WhichOneof("input")
    if which == "prompt":
        if _TOOL_MARKERS.search(request.prompt):
            return WorkloadClass.AGENT_TOOL
        long_prompt = len(request.prompt) >= _BATCH_PROMPT_CHARS
    elif which == "chat":
        chat = request.chat
        # An agent step: the model is offered functions, or the conversation carries calls and results.
        if chat.tools or any(m.role == "tool" or m.tool_calls for m in chat.messages):
            return WorkloadClass.AGENT_TOOL
        long_prompt = sum(len(m.content) for m in chat.messages) >= _BATCH_PROMPT_CHARS
    else:
        long_prompt = len(request.prompt_token_ids.ids) >= _BATCH_PROMPT_TOKENS
    if long_prompt or (max_tokens is not None and max_tokens >= _BATCH_MAX_TOKENS):
        return WorkloadClass.BATCH
    if max_tokens is not None and max_tokens <= _AGENT_MAX_TOKENS and sampling.stop:
        return WorkloadClass.AGENT_TOOL
    return WorkloadClass.REALTIME_CHAT
