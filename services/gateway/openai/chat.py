"""POST /v1/chat/completions: OpenAI's chat body as a GenerateRequest with chat input (the worker renders
it with the model's own chat template), and the reply in OpenAI's chat.completion shape."""

from __future__ import annotations

import json

from hanzo.inference.v1 import inference_pb2
from services.gateway.openai import tool_calls
from services.gateway.openai.errors import invalid
from services.gateway.openai.logprobs import chat_logprobs
from services.gateway.openai.sampling import fill_generate, fill_logprobs
from services.gateway.openai.schemas import (
    AssistantMessage,
    AssistantToolCall,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    Message,
    ToolCallFunction,
    ToolDef,
)
from services.gateway.openai.streaming import Chunks, Outcome, total_usage, usage_of

# vLLM's chat default: no budget means "until the reply ends or the context is full" (the engine stops
# at its context length), not the proto's 16. Set after classification, which reads an unset budget
# as a conversation turn.
UNTIL_CONTEXT_END = 2**31 - 1


def to_generate(body: ChatCompletionRequest) -> inference_pb2.GenerateRequest:
    """The request to route; HttpError (400) naming the field for what the mesh cannot serve. Roles and
    tools are checked by the request path itself (services.common.chat), as for the gRPC Chat."""
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs", "needs logprobs set to true")
    choice = tool_calls.mode(body)
    request = inference_pb2.GenerateRequest(model=body.model)
    chat = request.chat
    chat.SetInParent()  # an empty message list still selects chat input (the request path refuses it)
    for i, message in enumerate(body.messages):
        chat.messages.append(_message(i, message))
    for i, tool in enumerate(body.tools or ()):
        chat.tools.append(_tool(i, tool))
    budget = body.max_completion_tokens or body.max_tokens
    fill_generate(body, request, budget)
    fill_logprobs(request.sampling, "top_logprobs", (body.top_logprobs or 0) if body.logprobs else None)
    if choice is not None:
        chat.tool_choice = choice  # the worker forces or parses the calls
    return request


def fill_default_budget(request: inference_pb2.GenerateRequest) -> None:
    """After classification: no max_tokens means until the reply ends (as OpenAI and vLLM do)."""
    if not request.sampling.HasField("max_tokens"):
        request.sampling.max_tokens = UNTIL_CONTEXT_END


def reply(
    outcomes: list[Outcome], request_id: str, created: int, body: ChatCompletionRequest
) -> ChatCompletion:
    """The non-streamed chat.completion for a finished generation: a choice per outcome, its tool calls
    parsed out."""
    choice = tool_calls.mode(body)
    return ChatCompletion.model_construct(
        id=f"chatcmpl-{request_id}",
        object="chat.completion",
        created=created,
        model=body.model,
        choices=[
            _choice(index, outcome, choice, bool(body.logprobs)) for index, outcome in enumerate(outcomes)
        ],
        usage=usage_of(total_usage(o.usage for o in outcomes)),
    )


def _choice(index: int, outcome: Outcome, tool_choice: str | None, logprobs: bool) -> ChatChoice:
    parsed = tool_calls.parse(outcome.text, tool_choice)
    calls = [
        AssistantToolCall.model_construct(
            id=c.id,
            type="function",
            function=ToolCallFunction.model_construct(name=c.name, arguments=c.arguments),
        )
        for c in parsed.calls
    ]
    return ChatChoice.model_construct(
        index=index,
        message=AssistantMessage.model_construct(role="assistant", content=parsed.content, tool_calls=calls),
        logprobs=chat_logprobs(outcome.logprobs) if logprobs else None,
        finish_reason=finish_reason(outcome, parsed),
        stop_reason=outcome.stop_reason,
    )


def finish_reason(outcome: Outcome, parsed: tool_calls.Parsed) -> str | None:
    """ "tool_calls" for a reply that ended on its own with calls in it (the worker's reason then),
    else the engine's reason."""
    return "tool_calls" if parsed.calls and outcome.finish_reason == "stop" else outcome.finish_reason


def holds_calls(body: ChatCompletionRequest) -> str | None:
    """The tool mode of a request whose reply may hold calls (so it is streamed once whole), else None."""
    choice = tool_calls.mode(body)
    return None if choice in (None, "none") else choice


def chunks(request_id: str, created: int, model: str) -> Chunks:
    """The stream's chunk writer: chat.completion.chunk, the first delta naming the assistant role."""
    return Chunks(f"chatcmpl-{request_id}", "chat.completion.chunk", created, model, chat=True)


def _message(index: int, message: Message) -> inference_pb2.ChatMessage:
    # OpenAI's "developer" role is the system role for newer models; chat templates know "system".
    role = "system" if message.role == "developer" else message.role
    out = inference_pb2.ChatMessage(role=role, content=_content(index, message.content))
    if message.name:
        out.name = message.name
    if message.tool_call_id:
        out.tool_call_id = message.tool_call_id
    for call in message.tool_calls or ():
        out.tool_calls.add(id=call.id, name=call.function.name, arguments=call.function.arguments)
    return out


def _content(index: int, content: str | list | None) -> str:
    """A message's text; content parts other than text are refused (the mesh serves text models)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type != "text":
            raise invalid(
                f"messages[{index}].content[{j}].type",
                f"content parts of type {part.type!r} are not supported; only 'text'",
            )
        texts.append(part.text)
    return "\n".join(texts)  # as vLLM joins a message's text parts for string templates


def _tool(index: int, tool: ToolDef) -> inference_pb2.Tool:
    if tool.type != "function":
        raise invalid(f"tools[{index}].type", f"{tool.type!r} is not supported; only 'function'")
    function = tool.function
    parameters = json.dumps(function.parameters) if function.parameters is not None else ""
    return inference_pb2.Tool(
        name=function.name, description=function.description or "", parameters_json=parameters
    )
