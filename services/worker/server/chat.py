"""A Chat request on the worker: its messages rendered with the model's own chat template, and the tool
calls read back out of its replies."""

from __future__ import annotations

from typing import Any

from hanzo.inference.v1 import inference_pb2
from services.common.errors import InvalidArgument
from services.common.tool_calls import parse
from services.worker.models.errors import NoChatTemplateError
from services.worker.models.tokenizer import Tokenizer


def chat_prompt(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    tokenizer: Tokenizer | None,
    max_model_len: int,
) -> list[int]:
    """The templated prompt's token ids (messages and tools as template_inputs gives them), exactly those
    Hugging Face's apply_chat_template gives. InvalidArgument (naming the field) for a conversation that
    leaves no room to reply in the model's context of max_model_len tokens; NoChatTemplateError when the
    model has no template; ChatTemplateError when the template refuses the messages."""
    if tokenizer is None:
        raise NoChatTemplateError("the model ships no tokenizer, so no chat template; send prompt_token_ids")
    token_ids = tokenizer.apply_chat_template(messages, tools or None)
    if len(token_ids) >= max_model_len:
        raise InvalidArgument(
            "messages",
            f"the conversation is {len(token_ids)} tokens after the chat template, which leaves no room "
            f"to reply: the model's context is {max_model_len} tokens",
        )
    return token_ids


class ToolReplies:
    """The tool calls of a chat's replies: each choice's text kept until it ends, then parsed under the
    chat's tool mode (services/common/tool_calls.py) into its last response's tool_calls, with finish
    reason TOOL_CALLS for a reply that ended on its own with calls in it. Nothing kept without tools."""

    def __init__(self, mode: str | None) -> None:
        self.mode = mode
        self._texts: dict[int, list[str]] = {}

    def push(self, index: int, text: str) -> None:
        if self.mode not in (None, "none"):
            self._texts.setdefault(index, []).append(text)

    def finish(self, index: int, response: inference_pb2.GenerateResponse) -> None:
        """Fill a choice's last response (its finish reason already set)."""
        if self.mode in (None, "none"):
            return
        parsed = parse("".join(self._texts.pop(index, ())), self.mode)
        for call in parsed.calls:
            response.tool_calls.add(id=call.id, name=call.name, arguments=call.arguments)
        if parsed.calls and response.finish_reason == inference_pb2.FINISH_REASON_STOP:
            response.finish_reason = inference_pb2.FINISH_REASON_TOOL_CALLS
