"""A streamed auto-tool reply split into what is sent as content while it streams and what comes back as
calls at the end, whatever the deltas' boundaries (table-driven, no model)."""

from __future__ import annotations

import json

import pytest

from services.gateway.openai.auto_tool_stream import AutoToolText

CALL = '{"name": "weather", "arguments": {"city": "Oslo"}}'
OSLO = [("weather", {"city": "Oslo"})]


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize(
    ("text", "streamed", "at_end", "calls"),
    [
        ("plain words, no call", "plain words, no call", "", []),
        (f"Let me check. <tool_call>{CALL}</tool_call>", "Let me check. ", "", OSLO),
        (f"<tool_call>{CALL}</tool_call> done", "", "done", OSLO),
        ("a < b and <tool_ is not a tag", "a < b and <tool_ is not a tag", "", []),
        ("ends on a partial <tool_c", "ends on a partial ", "<tool_c", []),
        ("<tool_call>not json</tool_call>", "", "<tool_call>not json</tool_call>", []),
    ],
)  # fmt: skip
@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_content_streams_up_to_a_call_and_the_call_comes_at_the_end(
    text: str, streamed: str, at_end: str, calls: list, size: int
) -> None:
    choice = AutoToolText()
    sent = "".join(choice.content(delta) for delta in _split(text, size))
    rest, deltas = choice.rest()
    assert (sent, rest) == (streamed, at_end)
    assert [(d["function"]["name"], json.loads(d["function"]["arguments"])) for d in deltas] == calls
    assert [d["index"] for d in deltas] == list(range(len(calls)))
