"""A streamed chat reply that is a forced tool call (tool_choice "required" or a named function): its
text is held until the choice ends, then sent as OpenAI's tool_calls delta (each call with its index,
id, type, name and whole arguments), or as content if it did not come out a call (cut by max_tokens).
streaming.events runs the stream, one ForcedCallText per choice (auto_tool_stream.py streams "auto")."""

from __future__ import annotations

from services.gateway.openai import tool_calls
from services.gateway.openai.streaming import PlainText


class ForcedCallText(PlainText):
    """One choice's text under a forced call: nothing sent until the end, then the call parsed."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.text = ""

    def content(self, delta: str) -> str:
        self.text += delta
        return ""

    def rest(self) -> tuple[str, list[dict[str, object]]]:
        parsed = tool_calls.parse(self.text, self.mode)
        return parsed.content or "", [call_delta(i, call) for i, call in enumerate(parsed.calls)]


def call_delta(index: int, call: tool_calls.Call) -> dict[str, object]:
    """One call in OpenAI's tool_calls delta shape."""
    function = {"name": call.name, "arguments": call.arguments}
    return {"index": index, "id": call.id, "type": "function", "function": function}
