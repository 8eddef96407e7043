"""Tool calls on the OpenAI front: tool_choice turned into a constraint on the output, and the output
turned back into OpenAI's tool_calls.

- "required" or a named function: the reply is decoded under a JSON schema (structured output) that
  only admits {"name": <one of the tools>, "arguments": <valid for that tool's parameters>}, so it is a
  call whatever the model would have said; it comes back as one tool call.
- "auto" (the default with tools): the model decides; Hermes-style `<tool_call>{...}</tool_call>` blocks
  (the convention of the Qwen2 / Hermes / SmolLM2 family templates) are parsed out of its text, and what
  is left is the content.
- "none", or no tools: plain text.

A reply with calls ends with finish_reason "tool_calls". Streamed, a reply that may hold calls is sent
once it is whole (its text could turn out to be a call), in OpenAI's delta shape.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from hanzo.inference.v1 import inference_pb2
from services.gateway.openai.errors import invalid
from services.gateway.openai.schemas import ChatCompletionRequest

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Parsed:
    content: str | None
    calls: list[Call]


def mode(body: ChatCompletionRequest) -> str | None:
    """ "none", "auto", "required" or the named function; None when the request has no tools."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none", "auto"):
            raise invalid("tool_choice", "needs tools: the request declares none")
        return None
    if choice in (None, "auto", "none", "required"):
        return choice or "auto"
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if name not in {tool.function.name for tool in body.tools}:
            raise invalid("tool_choice", f"names no declared tool: {name!r}")
        return str(name)
    raise invalid(
        "tool_choice", "must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}"
    )


def constrain(
    body: ChatCompletionRequest, choice: str | None, sampling: inference_pb2.SamplingParams
) -> None:
    """For "required" or a named function, the reply's JSON schema (refused beside another constraint)."""
    if choice in (None, "none", "auto"):
        return
    if sampling.HasField("structured"):
        raise invalid(
            "tool_choice", "forcing a tool call cannot be combined with response_format or guided_*"
        )
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.function.name},
                "arguments": tool.function.parameters or _ANY_OBJECT,
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in body.tools or ()
        if choice == "required" or tool.function.name == choice
    ]
    sampling.structured.json_schema = json.dumps(calls[0] if len(calls) == 1 else {"anyOf": calls})


def parse(text: str, choice: str | None) -> Parsed:
    """The reply as content and calls: the whole text is one call under "required" or a name; under
    "auto" each well-formed <tool_call> block is one, the rest of the text the content."""
    if choice in (None, "none"):
        return Parsed(text, [])
    if choice != "auto":
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
