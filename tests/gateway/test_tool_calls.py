"""Tool calls on the OpenAI front, without a model: which mode a request asks for, the schema that forces
a call, and the reply's text parsed back into calls (table-driven)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from hanzo.inference.v1 import inference_pb2
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
    with pytest.raises(HttpError, match=words) as raised:
        tool_calls.mode(_body(**fields))
    assert raised.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("choice", "valid", "invalid"),
    [
        ("weather", {"name": "weather", "arguments": {"city": "Oslo"}}, {"name": "now", "arguments": {}}),
        ("required", {"name": "now", "arguments": {}}, {"name": "weather", "arguments": {}}),
    ],
)
def test_a_forced_call_is_held_to_the_tools_schemas(choice: str, valid: dict, invalid: dict) -> None:
    sampling = inference_pb2.SamplingParams()
    tool_calls.constrain(_body(tools=TOOLS), choice, sampling)
    schema = json.loads(sampling.structured.json_schema)
    jsonschema.validate(valid, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(invalid, schema)


def test_a_forced_call_and_another_constraint_are_refused_together() -> None:
    sampling = inference_pb2.SamplingParams(structured=inference_pb2.StructuredOutput(json_object=True))
    with pytest.raises(HttpError, match="cannot be combined"):
        tool_calls.constrain(_body(tools=TOOLS), "required", sampling)


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
