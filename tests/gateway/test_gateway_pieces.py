"""The gateway's pure pieces without a mesh: chat classification, the API-key
check, the HTTP settings, and the OpenAI error mapping (status, param, Retry-After)."""

from __future__ import annotations

import grpc
import pytest
from pydantic import ValidationError

from hanzo.inference.v1 import common_pb2, inference_pb2
from services.common.errors import InvalidArgument, NotFound, ResourceExhausted, ServiceError, Unauthenticated
from services.common.workload import WorkloadClass
from services.gateway.auth import ApiKeys
from services.gateway.classify import METADATA_KEY, classify_generate
from services.gateway.config import GatewaySettings
from services.gateway.openai.errors import from_exception, from_validation
from services.gateway.openai.schemas import ChatCompletionRequest, CompletionRequest
from services.gateway.router import DeadlineExceeded
from services.gateway.servicer import chat_to_generate
from services.gateway.validate import validate_generate
from services.worker.engine.errors import InvalidRequestError

USER = inference_pb2.ChatMessage(role="user", content="What is the weather in Paris?")
SEARCH = inference_pb2.Tool(name="search", parameters_json='{"type": "object"}')


def chat(*messages: inference_pb2.ChatMessage, **fields: object) -> inference_pb2.GenerateRequest:
    request = inference_pb2.ChatRequest(model="m", messages=messages or [USER], **fields)  # type: ignore[arg-type]
    return chat_to_generate(request)


@pytest.mark.parametrize(
    ("request_", "metadata", "expected"),
    [
        (chat(), None, WorkloadClass.REALTIME_CHAT),
        (chat(tools=[SEARCH]), None, WorkloadClass.AGENT_TOOL),
        (chat(USER, inference_pb2.ChatMessage(role="tool", content="12 C", tool_call_id="c1")), None,
         WorkloadClass.AGENT_TOOL),
        # Told otherwise: the field, then the metadata, win over the tools.
        (chat(tools=[SEARCH], workload_class=common_pb2.WORKLOAD_CLASS_BATCH), None, WorkloadClass.BATCH),
        (chat(tools=[SEARCH]), ((METADATA_KEY, "realtime_chat"),), WorkloadClass.REALTIME_CHAT),
        (chat(sampling=inference_pb2.SamplingParams(max_tokens=4096)), None, WorkloadClass.BATCH),
        (chat(inference_pb2.ChatMessage(role="user", content="x" * 9000)), None, WorkloadClass.BATCH),
    ],
)  # fmt: skip
def test_chat_classification(request_, metadata, expected) -> None:
    assert classify_generate(request_, metadata) is expected


def test_chat_to_generate_keeps_every_field() -> None:
    sampling = inference_pb2.SamplingParams(temperature=0.0, max_tokens=7, min_tokens=2, stop=["\n"])
    request = chat(tools=[SEARCH], sampling=sampling, request_id="r1", tenant="acme")
    assert request.WhichOneof("input") == "chat"
    assert list(request.chat.messages) == [USER] and list(request.chat.tools) == [SEARCH]
    assert request.sampling == sampling and request.request_id == "r1" and request.tenant == "acme"


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (chat(inference_pb2.ChatMessage(role="wizard", content="hi")), "messages[0].role"),
        (chat(tools=[inference_pb2.Tool(name="f", parameters_json="[1]")]), "tools[0].parameters_json"),
        (chat(tools=[inference_pb2.Tool(name="f", parameters_json="{nope")]), "tools[0].parameters_json"),
        (inference_pb2.GenerateRequest(model="m", chat=inference_pb2.ChatInput()), "messages"),
    ],
)
def test_chat_validation_names_the_field(request_, field) -> None:
    if not request_.chat.messages:
        request_.chat.SetInParent()
    with pytest.raises(InvalidArgument) as err:
        validate_generate(request_)
    assert err.value.field == field and str(err.value).startswith(f"{field}: ")


def test_api_keys() -> None:
    check = ApiKeys(frozenset({"k1", "k2"}))
    check({"authorization": "Bearer k2"})
    check({"authorization": "bearer  k1 "})
    for header, words in [
        ({}, "missing"),
        ({"authorization": "Basic k1"}, "Bearer"),
        ({"authorization": "Bearer"}, "Bearer"),
        ({"authorization": "Bearer k3"}, "unknown API key"),
        ({"authorization": "Bearer ключ"}, "unknown API key"),  # non-ASCII: refused, not a TypeError
    ]:
        with pytest.raises(Unauthenticated, match=words):
            check(header)


@pytest.mark.parametrize(
    ("value", "port"), [(None, 8000), ("", None), ("off", None), ("OFF", None), ("0", 0), ("8123", 8123)]
)
def test_http_port_setting(value: str | None, port: int | None) -> None:
    environ = {} if value is None else {"HANZO_GATEWAY_HTTP_PORT": value}
    assert GatewaySettings.from_env(environ).http_port == port


def test_http_port_setting_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="HANZO_GATEWAY_HTTP_PORT"):
        GatewaySettings.from_env({"HANZO_GATEWAY_HTTP_PORT": "eighty"})


def _relayed(code: grpc.StatusCode, message: str) -> ServiceError:
    error = ServiceError(message)
    error.code = code
    return error


@pytest.mark.parametrize(
    ("exc", "status", "param", "code"),
    [
        (InvalidArgument("prompt_token_ids", "token id 9999 is outside"), 400, "prompt", None),
        (InvalidArgument("inputs[1]", "is empty"), 400, "input[1]", None),
        (InvalidArgument("tools[0].parameters_json", "is not JSON"), 400, "tools[0].function.parameters",
         None),
        (InvalidRequestError("top_p", "must be in (0, 1]"), 400, "top_p", None),
        (_relayed(grpc.StatusCode.INVALID_ARGUMENT, "worker w1: messages: 1200 tokens, which leaves no room "
                  "to reply"), 400, "messages", "context_length_exceeded"),
        (_relayed(grpc.StatusCode.FAILED_PRECONDITION, "worker w1: no chat template"), 400, None,
         "unsupported_model"),
        (Unauthenticated("unknown API key"), 401, None, "invalid_api_key"),
        (NotFound("model 'gpt-9' is not served"), 404, "model", "model_not_found"),
        (DeadlineExceeded("late"), 504, None, "timeout"),
        (KeyError("bug"), 500, None, None),
    ],
)  # fmt: skip
def test_error_mapping(exc: BaseException, status: int, param: str | None, code: str | None) -> None:
    error = from_exception(exc)
    assert (error.status, error.param, error.code) == (status, param, code)
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_overload_maps_to_429_with_retry_after() -> None:
    error = from_exception(ResourceExhausted("every worker tried is overloaded", retry_after_s=2.3))
    assert error.status == 429 and error.headers == {"retry-after": "3", "retry-after-ms": "2300"}
    relayed = from_exception(ResourceExhausted("worker w1: queue full", retry_after_s=0.2))
    assert relayed.headers == {"retry-after": "1", "retry-after-ms": "200"}  # whole seconds, at least one
    assert from_exception(ResourceExhausted("no advice")).headers == {}


@pytest.mark.parametrize(
    ("schema", "body", "param"),
    [
        (ChatCompletionRequest, '{"model": "m"}', "messages"),
        (ChatCompletionRequest, '{"model": "m", "messages": [{"role": "user", "content": 5}]}',
         "messages[0].content"),
        (ChatCompletionRequest, '{"model": "m", "messages": [], "max_tokens": 0}', "max_tokens"),
        (CompletionRequest, '{"model": "m", "prompt": [1, -2]}', "prompt"),
        (CompletionRequest, "{not json", None),
    ],
)  # fmt: skip
def test_body_validation_names_the_field(schema, body: str, param: str | None) -> None:
    with pytest.raises(ValidationError) as err:
        schema.model_validate_json(body)
    error = from_validation(err.value)
    assert error.status == 400 and error.param == param
