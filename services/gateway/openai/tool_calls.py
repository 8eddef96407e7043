"""Tool calls on the OpenAI front: OpenAI's tool_choice as the mode the worker serves (it forces a call
for "required" or a named function and parses the calls out of the reply: services/common/tool_calls.py,
whose parse the front uses for the reply's content and calls). Streamed, a reply that may hold calls is
sent once it is whole (its text could turn out to be a call), in OpenAI's delta shape."""

from __future__ import annotations

from services.common.tool_calls import MODES, Call, Parsed, parse, tool_mode
from services.gateway.openai.errors import invalid
from services.gateway.openai.schemas import ChatCompletionRequest

__all__ = ["Call", "Parsed", "mode", "parse"]
_SHAPES = "must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}"


def mode(body: ChatCompletionRequest) -> str | None:
    """ "none", "auto", "required" or the named function; None when the request has no tools. A 400
    naming tool_choice for one the tools cannot meet (tool_mode's checks, as over gRPC)."""
    choice = body.tool_choice
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        choice = (function or {}).get("name") if isinstance(function, dict) else None
        if not isinstance(choice, str) or not choice:
            raise invalid("tool_choice", _SHAPES)
    elif choice is not None and choice not in MODES:
        raise invalid("tool_choice", _SHAPES)
    return tool_mode(choice or "", [tool.function.name for tool in body.tools or ()])
