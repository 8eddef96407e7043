"""What the gateway checks before placing a request: anything the worker would refuse anyway, refused
here with InvalidArgument naming the field, so a bad request never takes a pick or a worker's time."""

from __future__ import annotations

from collections.abc import Sequence

from hanzo.inference.v1 import inference_pb2
from services.common.chat import template_inputs, tool_choice_params
from services.common.errors import InvalidArgument
from services.common.sampling_proto import sampling_params


def validate_generate(request: inference_pb2.GenerateRequest) -> str | Sequence[int]:
    """The request's prefix-affinity key: the prompt (text or token ids), or for a chat the text of its
    opening (opening_key); InvalidArgument naming the field for bad input."""
    if not request.model:
        raise InvalidArgument("model", "is empty; name a model (ListModels shows them)")
    which = request.WhichOneof("input")
    if which is None:
        raise InvalidArgument("prompt", "missing: set prompt (text), prompt_token_ids or chat")
    params = sampling_params(request.sampling)  # the worker's own check: InvalidArgument naming the field
    if which == "chat":
        # The worker's own checks: roles, tool calls, parameters_json, tool_choice.
        _, tools = template_inputs(request.chat)
        tool_choice_params(request.chat.tool_choice, tools, params)
        key: str | Sequence[int] = opening_key(request.chat)
    else:
        # The token ids stay in the message: copying a long prompt into a list costs more than the rest.
        key = request.prompt if which == "prompt" else request.prompt_token_ids.ids
        if not key:
            raise InvalidArgument("prompt", "is empty; send text or at least one token id")
    return key


def opening_key(chat: inference_pb2.ChatInput) -> str:
    """A conversation's affinity key: the role and content of its opening, every message up to the end
    of the first user message. Each later turn of the conversation opens the same way, so all its turns
    hash alike (a key over every message would change with each turn while shorter than the 512
    characters prefix_hash reads) and meet on the worker that caches their common prefix."""
    parts: list[str] = []
    for message in chat.messages:
        parts += (message.role, "\x1f", message.content, "\x1e")
        if message.role == "user":
            break
    return "".join(parts)


def validate_embed(request: inference_pb2.EmbedRequest) -> None:
    """InvalidArgument naming the field for a request no worker could serve."""
    if not request.model:
        raise InvalidArgument("model", "is empty; name an embedding model (ListModels shows them)")
    if not request.inputs:
        raise InvalidArgument("inputs", "is empty; send at least one text")
    for i, text in enumerate(request.inputs):
        if not text.strip():
            raise InvalidArgument(f"inputs[{i}]", "is empty")
