"""A Chat request's prompt on the worker: its messages rendered with the model's own chat template."""

from __future__ import annotations

from hanzo.inference.v1 import inference_pb2
from services.common.chat import template_inputs
from services.common.errors import InvalidArgument
from services.worker.models.errors import NoChatTemplateError
from services.worker.models.tokenizer import Tokenizer


def chat_prompt(chat: inference_pb2.ChatInput, tokenizer: Tokenizer | None, max_model_len: int) -> list[int]:
    """The templated prompt's token ids, exactly those Hugging Face's apply_chat_template gives.
    InvalidArgument (naming the field) for bad messages or a conversation that leaves no room to reply
    in the model's context of max_model_len tokens; NoChatTemplateError when the model has no template;
    ChatTemplateError when the template refuses the messages."""
    messages, tools = template_inputs(chat)
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
