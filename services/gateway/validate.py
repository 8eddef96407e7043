"""What the gateway checks before placing a request: anything the worker would refuse anyway, refused
here with InvalidArgument naming the field, so a bad request never takes a pick or a worker's time."""

from __future__ import annotations

from hanzo.inference.v1 import inference_pb2
from services.common.chat import template_inputs, tool_choice_params
from services.common.errors import InvalidArgument
from services.common.sampling_proto import sampling_params
from services.gateway.prefix_chain import Prompt, chat_key


def validate_generate(request: inference_pb2.GenerateRequest) -> Prompt:
    """The request's prompt for its prefix chain: the text or token ids, or a chat's messages as text
    (chat_key); InvalidArgument naming the field for bad input."""
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
        key: Prompt = chat_key(request.chat)
    else:
        # The token ids stay in the message: copying a long prompt into a list costs more than the rest.
        key = request.prompt if which == "prompt" else request.prompt_token_ids.ids
        if not key:
            raise InvalidArgument("prompt", "is empty; send text or at least one token id")
    return key


def validate_embed(request: inference_pb2.EmbedRequest) -> None:
    """InvalidArgument naming the field for a request no worker could serve."""
    if not request.model:
        raise InvalidArgument("model", "is empty; name an embedding model (ListModels shows them)")
    if not request.inputs:
        raise InvalidArgument("inputs", "is empty; send at least one text")
    for i, text in enumerate(request.inputs):
        if not text.strip():
            raise InvalidArgument(f"inputs[{i}]", "is empty")
