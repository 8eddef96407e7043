"""A streamed chat reply under tool_choice "auto": its text streams as content until a `<tool_call>` tag
begins, and what follows the tag is held until the choice ends, then sent as OpenAI's tool_calls delta
(each call with its index, id, type, name and whole arguments). Text that could still turn out to be the
start of the tag is held back, so a tag is never half-sent as content; a reply that never calls a tool
streams like any other. streaming.events runs the stream, one AutoToolText per choice; the finish
reason is the worker's (tool_calls when it found calls in the whole reply)."""

from __future__ import annotations

from services.common.tool_calls import OPEN_TAG, parse
from services.gateway.openai.streaming import PlainText
from services.gateway.openai.tool_stream import call_delta


class AutoToolText(PlainText):
    """One choice's text under tool_choice "auto" (streaming.events' per-choice hook): what was sent as
    content, and whether a call has begun."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0
        self.call_at: int | None = None  # where the first <tool_call> tag starts

    def content(self, delta: str) -> str:
        """The content to send now after delta arrives: up to a tag, and never a possible tag's start."""
        self.text += delta
        if self.call_at is not None:
            return ""
        found = self.text.find(OPEN_TAG, max(0, self.sent - len(OPEN_TAG)))
        if found >= 0:
            self.call_at = found
            return self._take(found)
        return self._take(len(self.text) - _partial_tag(self.text))

    def rest(self) -> tuple[str, list[dict[str, object]]]:
        """At the end: the content not yet sent and the calls found after the tag."""
        if self.call_at is None:
            return self._take(len(self.text)), []
        parsed = parse(self.text[self.call_at :], "auto")
        if not parsed.calls:  # a tag but no well-formed call after all: it was content
            return self._take(len(self.text)), []
        self.sent = len(self.text)
        return parsed.content or "", [call_delta(i, call) for i, call in enumerate(parsed.calls)]

    def _take(self, upto: int) -> str:
        out = self.text[self.sent : upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return out


def _partial_tag(text: str) -> int:
    """How many trailing characters of text are the start of the tag (so must wait for more)."""
    for size in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-size:]):
            return size
    return 0
