"""A chat request's messages and tools, from protobuf to the OpenAI-shaped dicts chat templates read.

One function validates and converts: the gateway calls it to refuse bad input before placing the
request, the worker to render the template, so both agree on what a valid chat is.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hanzo.inference.v1 import inference_pb2
from services.common.errors import InvalidArgument
from services.common.sampling import SamplingParams
from services.common.structured import StructuredOutput, StructureKind
from services.common.tool_calls import call_schema, forces_call, tool_mode

ROLES = ("system", "user", "assistant", "tool")


def template_inputs(chat: inference_pb2.ChatInput) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) as Hugging Face chat templates expect them: messages as OpenAI's (role, content,
    name, tool_call_id, tool_calls with JSON arguments parsed into objects, as templates index into
    them), tools as [{"type": "function", "function": {name, description, parameters}}].
    InvalidArgument naming the field for no messages, an unknown role, a tool without a name, or
    parameters_json that is not a JSON object."""
    if not chat.messages:
        raise InvalidArgument("messages", "is empty; send at least one message")
    messages = [_message(i, m) for i, m in enumerate(chat.messages)]
    tools = [_tool(i, t) for i, t in enumerate(chat.tools)]
    return messages, tools


def tool_choice_params(
    tool_choice: str, tools: list[dict[str, Any]], params: SamplingParams
) -> tuple[SamplingParams, str | None]:
    """A chat's tool mode (services/common/tool_calls.py; None without tools) and params with the schema
    that forces a call under "required" or a named tool; tools as template_inputs gives them.
    InvalidArgument naming tool_choice for a choice the tools cannot meet, or one forcing a call beside
    another structured output constraint."""
    functions = [tool["function"] for tool in tools]
    mode = tool_mode(tool_choice, [f["name"] for f in functions])
    if not forces_call(mode):
        return params, mode
    assert mode is not None
    if params.structured is not None:
        raise InvalidArgument(
            "tool_choice", "forcing a tool call cannot be combined with another structured output constraint"
        )
    schema = call_schema([(f["name"], f.get("parameters")) for f in functions], mode)
    structured = StructuredOutput(StructureKind.JSON_SCHEMA, schema)
    return dataclasses.replace(params, structured=structured), mode


def _message(index: int, message: inference_pb2.ChatMessage) -> dict[str, Any]:
    field = f"messages[{index}]"
    if message.role not in ROLES:
        raise InvalidArgument(
            f"{field}.role", f"unknown role {message.role!r}; use one of {', '.join(ROLES)}"
        )
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name:
        out["name"] = message.name
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        if message.role != "assistant":
            raise InvalidArgument(f"{field}.tool_calls", "only an assistant message carries tool calls")
        out["tool_calls"] = [
            _tool_call(f"{field}.tool_calls[{j}]", c) for j, c in enumerate(message.tool_calls)
        ]
    return out


def _tool_call(field: str, call: inference_pb2.ToolCall) -> dict[str, Any]:
    if not call.name:
        raise InvalidArgument(f"{field}.name", "is empty; name the function that was called")
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        arguments = call.arguments  # kept as the model wrote it: templates print it either way
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def _tool(index: int, tool: inference_pb2.Tool) -> dict[str, Any]:
    field = f"tools[{index}]"
    if not tool.name:
        raise InvalidArgument(f"{field}.name", "is empty; a tool needs the function's name")
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    if tool.parameters_json:
        try:
            parameters = json.loads(tool.parameters_json)
        except ValueError as err:
            raise InvalidArgument(f"{field}.parameters_json", f"is not JSON ({err})") from None
        if not isinstance(parameters, dict):
            raise InvalidArgument(f"{field}.parameters_json", "must be a JSON object (a JSON Schema)")
        function["parameters"] = parameters
    return {"type": "function", "function": function}
