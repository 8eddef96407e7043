"""Tool calls in a chat, on both APIs: the tool choice as a constraint on the output, and the output
read back as calls. The worker applies both (so gRPC's Chat returns calls as fields); the OpenAI front
reads its replies with the same parse.

- "required" or a named function: the reply is decoded under a JSON schema (structured output) that
  only admits {"name": <one of the tools>, "arguments": <valid for that tool's parameters>}, so it is a
  call whatever the model would have said; it comes back as one tool call.
- "auto" (the default with tools): the model decides; Hermes-style `<tool_call>{...}</tool_call>` blocks
  (the convention of the Qwen2 / Hermes / SmolLM2 family templates) are parsed out of its text, and what
  is left is the content.
- "none", or no tools: plain text.

A reply with calls that ended on its own ends with finish reason "tool_calls".
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.common.errors import InvalidArgument

OPEN_TAG = "<tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
MODES = ("none", "auto", "required")  # or a declared function's name


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Parsed:
    content: str | None
    calls: list[Call]


def tool_mode(choice: str, tool_names: Sequence[str]) -> str | None:
    """A request's tool choice ("" for the default) as "none", "auto", "required" or the named function;
    None without tools. InvalidArgument naming tool_choice for a choice the tools cannot meet."""
    if not tool_names:
        if choice not in ("", "none", "auto"):
            raise InvalidArgument("tool_choice", "needs tools: the request declares none")
        return None
    if not choice or choice in MODES:
        return choice or "auto"
    if choice not in tool_names:
        raise InvalidArgument(
            "tool_choice", f"names no declared tool: {choice!r}; use none, auto, required or a tool's name"
        )
    return choice


def forces_call(mode: str | None) -> bool:
    """Whether the output is constrained to be a call ("required" or a named function)."""
    return mode not in (None, "none", "auto")


def call_schema(tools: Sequence[tuple[str, dict[str, Any] | None]], mode: str) -> str:
    """The JSON schema (as text) admitting exactly one call of the tools mode allows: (name, parameters
    schema or None for any object) each."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters or _ANY_OBJECT},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, parameters in tools
        if mode == "required" or name == mode
    ]
    return json.dumps(calls[0] if len(calls) == 1 else {"anyOf": calls})


def parse(text: str, mode: str | None) -> Parsed:
    """The reply as content and calls: the whole text is one call under "required" or a name; under
    "auto" each well-formed <tool_call> block is one, the rest of the text the content."""
    if mode in (None, "none"):
        return Parsed(text, [])
    if mode != "auto":
        call = _call(text)
        return Parsed(None, [call]) if call is not None else Parsed(text, [])  # cut by max_tokens
    calls = []
    rest = []
    end = 0
    for block in _BLOCK.finditer(text):
        call = _call(block.group(1))
        if call is None:
            continue  # not a call after all: it stays in the text
        calls.append(call)
        rest.append(text[end : block.start()])
        end = block.end()
    rest.append(text[end:])
    content = "".join(rest).strip() if calls else text
    return Parsed(content or None, calls)


def _call(text: str) -> Call | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return Call(f"call_{uuid.uuid4().hex[:24]}", value["name"], json.dumps(arguments, ensure_ascii=False))
