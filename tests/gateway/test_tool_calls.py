"""Tool calls without a model: which mode an OpenAI request asks for, the schema that forces a call (as
both APIs build it from a chat's tools), and the reply's text parsed back into calls (table-driven)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from hanzo.inference.v1 import inference_pb2
from services.common.chat import template_inputs, tool_choice_params
from services.common.errors import InvalidArgument
from services.common.sampling import SamplingParams
from services.common.structured import StructuredOutput, StructureKind
from services.gateway.openai import tool_calls
from services.gateway.openai.errors import HttpError
from services.gateway.openai.schemas import ChatCompletionRequest

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "now"}},
]


def _body(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [], **fields})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"tool_choice": "none"}, None),
        ({"tools": TOOLS}, "auto"),
        ({"tools": TOOLS, "tool_choice": "none"}, "none"),
        ({"tools": TOOLS, "tool_choice": "required"}, "required"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "now"}}}, "now"),
    ],
)
def test_the_mode_a_request_asks_for(fields: dict, expected: str | None) -> None:
    assert tool_calls.mode(_body(**fields)) == expected


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"tool_choice": "required"}, "needs tools"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "no declared tool",
        ),
        ({"tools": TOOLS, "tool_choice": "always"}, "must be"),
    ],
)
def test_bad_tool_choices_name_the_field(fields: dict, words: str) -> None:
    with pytest.raises((HttpError, InvalidArgument), match=words) as raised:
        tool_calls.mode(_body(**fields))
    error = raised.value
    assert (error.param if isinstance(error, HttpError) else error.field) == "tool_choice"


@pytest.mark.parametrize(
    ("choice", "valid", "invalid"),
    [
        ("weather", {"name": "weather", "arguments": {"city": "Oslo"}}, {"name": "now", "arguments": {}}),
        ("required", {"name": "now", "arguments": {}}, {"name": "weather", "arguments": {}}),
    ],
)
def test_a_forced_call_is_held_to_the_tools_schemas(choice: str, valid: dict, invalid: dict) -> None:
    params, mode = _tool_choice_params(_chat(choice), SamplingParams())
    assert mode == choice and params.structured is not None
    schema = json.loads(params.structured.spec)
    jsonschema.validate(valid, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(invalid, schema)


@pytest.mark.parametrize(("choice", "mode"), [("", "auto"), ("auto", "auto"), ("none", "none")])
def test_a_call_not_forced_leaves_the_sampling_alone(choice: str, mode: str) -> None:
    params = SamplingParams(temperature=0.3)
    assert _tool_choice_params(_chat(choice), params) == (params, mode)


def test_a_forced_call_and_another_constraint_are_refused_together() -> None:
    params = SamplingParams(structured=StructuredOutput(StructureKind.JSON_OBJECT))
    with pytest.raises(InvalidArgument, match="cannot be combined") as raised:
        _tool_choice_params(_chat("required"), params)
    assert raised.value.field == "tool_choice"


@pytest.mark.parametrize(("choice", "words"), [("nope", "names no declared tool"), ("always", "no declared")])
def test_a_grpc_tool_choice_the_tools_cannot_meet_is_refused(choice: str, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        _tool_choice_params(_chat(choice), SamplingParams())


def _tool_choice_params(chat: inference_pb2.ChatInput, params: SamplingParams) -> tuple:
    return tool_choice_params(chat.tool_choice, template_inputs(chat)[1], params)


def _chat(choice: str) -> inference_pb2.ChatInput:
    tools = [
        inference_pb2.Tool(name="weather", parameters_json=json.dumps(WEATHER)),
        inference_pb2.Tool(name="now"),
    ]
    messages = [inference_pb2.ChatMessage(role="user", content="hi")]
    return inference_pb2.ChatInput(messages=messages, tools=tools, tool_choice=choice)


CALL = '{"name": "weather", "arguments": {"city": "Oslo"}}'


@pytest.mark.parametrize(
    ("text", "choice", "content", "calls"),
    [
        ("plain words", "auto", "plain words", []),
        (f"Let me check.\n<tool_call>\n{CALL}\n</tool_call>", "auto", "Let me check.",
         [("weather", {"city": "Oslo"})]),
        (f"<tool_call>{CALL}</tool_call><tool_call>" + '{"name": "now", "arguments": {}}</tool_call>', "auto",
         None, [("weather", {"city": "Oslo"}), ("now", {})]),
        ("<tool_call>not json</tool_call>", "auto", "<tool_call>not json</tool_call>", []),
        (CALL, "weather", None, [("weather", {"city": "Oslo"})]),
        ('{"name": "weather", "argu', "required", '{"name": "weather", "argu', []),  # cut by max_tokens
        (f"<tool_call>{CALL}</tool_call>", "none", f"<tool_call>{CALL}</tool_call>", []),
    ],
)  # fmt: skip
def test_replies_parse_into_content_and_calls(
    text: str, choice: str, content: str | None, calls: list
) -> None:
    parsed = tool_calls.parse(text, choice)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    assert len({c.id for c in parsed.calls}) == len(calls) and all(
        c.id.startswith("call_") for c in parsed.calls
    )
