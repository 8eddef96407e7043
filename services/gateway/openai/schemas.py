"""Request and reply bodies of the OpenAI-compatible API, as pydantic models (OpenAI's field names).

Requests ignore fields they do not know, as OpenAI's and vLLM's servers do; fields the mesh knows but
cannot honour (echo, suffix, best_of > 1, ...) are declared so that a request setting them gets a 400
naming the field instead of a silently different answer (sampling.py checks them). Replies are built
with model_construct from values the gateway made itself, so nothing is validated twice.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TokenId = Annotated[int, Field(ge=0, lt=2**32)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


class JsonSchemaFormat(_Request):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    """OpenAI's response_format: free text, any JSON object, or JSON valid for a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(_Request):
    """The sampling fields /v1/chat/completions and /v1/completions share (vLLM's extensions included)."""

    model: str
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM: 0 or -1 disables it
    max_tokens: int | None = Field(None, ge=1)
    min_tokens: int = Field(0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    n: int | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    workload_class: str | None = None  # the mesh's own: realtime_chat, agent_tool, batch
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM's
    min_p: float | None = None  # vLLM's
    logit_bias: dict[str, float] | None = None  # token id (as a string, OpenAI's form) -> bias
    # Structured output: OpenAI's response_format, or one of vLLM's guided_* fields.
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None


class ContentPart(_Request):
    type: str
    text: str = ""


class FunctionCall(_Request):
    name: str
    arguments: str = ""  # JSON text, as the model wrote it


class ToolCall(_Request):
    id: str = ""
    type: str = "function"
    function: FunctionCall


class Message(_Request):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None


class FunctionDef(_Request):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Request):
    type: str = "function"
    function: FunctionDef


class ChatCompletionRequest(SamplingFields):
    messages: list[Message]
    tools: list[ToolDef] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = None


class EmbeddingRequest(_Request):
    model: str
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


# Replies.


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text


class AssistantToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[AssistantToolCall] = []


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None  # {"content": [...]}: logprobs.py
    finish_reason: str | None
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended it


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None  # the legacy shape: logprobs.py
    finish_reason: str | None
    stop_reason: str | int | None = None  # as ChatChoice's


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32, as OpenAI sends it


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "hanzo"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
