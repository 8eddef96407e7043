"""Chat on a real worker over loopback: the messages are rendered with the checkpoint's own chat template
into exactly the tokens transformers' apply_chat_template gives, generation stops at the template's end
of turn, min_tokens holds EOS back, and bad chats get a precise status naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pytest

from hanzo.inference.v1 import common_pb2, inference_pb2
from services.worker.server.config import WorkerSettings
from tests.worker.server.serving import no_placer, serving

CHAT = common_pb2.WORKLOAD_CLASS_REALTIME_CHAT
HELLO = [inference_pb2.ChatMessage(role="user", content="Hello there")]


def chat_request(
    messages, model: str = "llama", tools=(), **sampling: object
) -> inference_pb2.GenerateRequest:
    params = inference_pb2.SamplingParams(**{"temperature": 0.0, "max_tokens": 8, **sampling})  # type: ignore[arg-type]
    chat = inference_pb2.ChatInput(messages=messages, tools=list(tools))
    return inference_pb2.GenerateRequest(model=model, chat=chat, sampling=params, workload_class=CHAT)


@pytest.fixture
def no_template_dir(tmp_path: Path, llama_gqa_dir: Path) -> Path:
    """The tiny checkpoint with its chat template taken out."""
    copy = shutil.copytree(llama_gqa_dir, tmp_path / "no-template")
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["chat_template"]
    config_path.write_text(json.dumps(config))
    return copy


@pytest.fixture
def settings(tmp_path: Path, llama_gqa_dir: Path, no_template_dir: Path) -> WorkerSettings:
    return WorkerSettings(
        port=0, node_id="w1", placer_address=no_placer(tmp_path), heartbeat_interval_s=60.0,
        models={"llama": llama_gqa_dir, "plain": no_template_dir}, arena_bytes=0, kv_cache_bytes=1 << 22,
    )  # fmt: skip


async def test_chat_prompt_is_the_reference_template_and_equals_generate(
    settings: WorkerSettings, llama_gqa_dir: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(llama_gqa_dir)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    expected = list(
        reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    async with serving(settings) as (_, stub):
        proto = [inference_pb2.ChatMessage(**m) for m in messages]
        chat = [r async for r in stub.Generate(chat_request(proto, ignore_eos=True))]
        same = inference_pb2.GenerateRequest(
            model="llama", prompt_token_ids=inference_pb2.TokenIds(ids=expected),
            sampling=inference_pb2.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
            workload_class=CHAT,
        )  # fmt: skip
        plain = [r async for r in stub.Generate(same)]
    assert chat[-1].usage.prompt_tokens == len(expected)
    assert [t for r in chat for t in r.token_ids] == [t for r in plain for t in r.token_ids]
    assert "".join(r.text for r in chat) == "".join(r.text for r in plain)


async def test_min_tokens_holds_the_end_of_turn_back(settings: WorkerSettings) -> None:
    async with serving(settings) as (_, stub):
        natural = [t async for r in stub.Generate(chat_request(HELLO, ignore_eos=True)) for t in r.token_ids]
        # The reply's own first token as a stop id: without min_tokens it ends the reply at once.
        stop = [natural[0]]
        early = [r async for r in stub.Generate(chat_request(HELLO, stop_token_ids=stop))]
        held = [r async for r in stub.Generate(chat_request(HELLO, stop_token_ids=stop, min_tokens=5))]
    assert early[-1].usage.completion_tokens == 1
    assert early[-1].WhichOneof("stop_reason") == "stop_token_id" and early[-1].stop_token_id == stop[0]
    held_ids = [t for r in held for t in r.token_ids]
    assert len(held_ids) >= 5
    assert natural[0] not in held_ids[:5]


async def test_a_chat_can_be_held_to_fixed_choices(settings: WorkerSettings) -> None:
    choices = inference_pb2.StructuredOutput(choice=inference_pb2.Choices(values=["sunny", "rainy day"]))
    async with serving(settings) as (_, stub):
        for temperature in (0.0, 1.0):
            request = chat_request(HELLO, structured=choices, temperature=temperature, max_tokens=16)
            replies = [r async for r in stub.Generate(request)]
            assert "".join(r.text for r in replies) in ("sunny", "rainy day")
            assert replies[-1].finish_reason == inference_pb2.FINISH_REASON_STOP


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        (chat_request([]), grpc.StatusCode.INVALID_ARGUMENT, "messages: is empty"),
        (chat_request([inference_pb2.ChatMessage(role="robot", content="hi")]),
         grpc.StatusCode.INVALID_ARGUMENT, "messages[0].role: unknown role 'robot'"),
        (chat_request(HELLO, tools=[inference_pb2.Tool(name="f", parameters_json="[1]")]),
         grpc.StatusCode.INVALID_ARGUMENT, "tools[0].parameters_json: must be a JSON object"),
        (chat_request([inference_pb2.ChatMessage(role="user", content="word " * 2000)]),
         grpc.StatusCode.INVALID_ARGUMENT, "messages: the conversation is"),
        (chat_request(HELLO, model="plain"), grpc.StatusCode.FAILED_PRECONDITION, "no chat template"),
        (chat_request(HELLO, min_tokens=9), grpc.StatusCode.INVALID_ARGUMENT, "min_tokens"),
        (chat_request(HELLO, presence_penalty=-2.5), grpc.StatusCode.INVALID_ARGUMENT,
         "presence_penalty: must be in [-2, 2]"),
        (chat_request(HELLO, repetition_penalty=0.0), grpc.StatusCode.INVALID_ARGUMENT,
         "repetition_penalty: must be a finite number > 0"),
        (chat_request(HELLO, min_p=2.0), grpc.StatusCode.INVALID_ARGUMENT, "min_p: must be in [0, 1]"),
        (chat_request(HELLO, logit_bias={7: 150.0}), grpc.StatusCode.INVALID_ARGUMENT,
         "logit_bias: biases must be in [-100, 100]"),
        (chat_request(HELLO, logit_bias={10**6: 1.0}), grpc.StatusCode.INVALID_ARGUMENT,
         "logit_bias: token id 1000000 is outside the vocabulary"),
        (chat_request(HELLO, structured=inference_pb2.StructuredOutput(regex="(unclosed")),
         grpc.StatusCode.INVALID_ARGUMENT, "structured_output: cannot be compiled into a grammar"),
        (chat_request(HELLO, structured=inference_pb2.StructuredOutput(json_schema="{oops")),
         grpc.StatusCode.INVALID_ARGUMENT, "structured_output: the JSON schema is not valid JSON"),
    ],
    ids=["no-messages", "unknown-role", "bad-tool-schema", "too-long", "no-template", "min-over-max",
         "presence", "repetition", "min-p", "bias-range", "bias-vocab", "grammar", "schema-json"],
)  # fmt: skip
async def test_bad_chats_get_a_precise_status(
    settings: WorkerSettings, request_: inference_pb2.GenerateRequest, code: grpc.StatusCode, words: str
) -> None:
    async with serving(settings) as (_, stub):
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            _ = [r async for r in stub.Generate(request_)]
        assert failed.value.code() == code
        assert words in (failed.value.details() or "")
        # Nothing else is affected: the next chat is served.
        ok = [r async for r in stub.Generate(chat_request(HELLO))]
        assert ok[-1].finish_reason != inference_pb2.FINISH_REASON_UNSPECIFIED
