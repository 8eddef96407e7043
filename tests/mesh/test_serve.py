"""`hanzo-mesh serve MODEL...` as a user runs it: a subprocess that prints where to reach the mesh, serves
the model over gRPC and the OpenAI front, and stops cleanly on SIGTERM; and its refusals of bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from services.mesh.cli import build_parser
from services.mesh.process import ROOT
from services.mesh.serve import access_lines, serving_models, worker_env

READY_S = 240  # load time of the real model on a busy 2-core machine included
# A Redis URL with its password in clear (anything but redact_url's ***) in printed or logged text.
CLEAR_REDIS_PASSWORD = re.compile(r"rediss?://[^\s/@]*:(?!\*\*\*@)[^\s/@]*@")


def clear_redis_passwords(run_root: Path, *texts: str) -> list[str]:
    """Every Redis URL that shows its password, in texts and in the service logs under run_root."""
    logs = [p.read_text(errors="replace") for p in run_root.rglob("*.log")]
    return [m.group(0) for text in (*texts, *logs) for m in CLEAR_REDIS_PASSWORD.finditer(text)]


@contextmanager
def served(tmp_path: Path, *argv: str) -> Iterator[dict[str, str]]:
    """`hanzo-mesh serve argv` until it prints its access lines; yields them by label (gateway, openai,
    prometheus where asked for, api key); SIGTERM at the end must stop it with exit code 0."""
    log = tmp_path / "serve.out"
    cmd = [sys.executable, "-m", "services.mesh", "serve", *argv, "--run-root", str(tmp_path / "runs")]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        lines = _access(proc, log)
        yield lines
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        assert code == 0, log.read_text()[-4000:]
    # The process table shows the private Redis's url (the placer's row) redacted, the logs too.
    assert "redis redis://:***@127.0.0.1:" in log.read_text()
    assert clear_redis_passwords(tmp_path / "runs", log.read_text()) == []


def _access(proc: subprocess.Popen[str], log: Path) -> dict[str, str]:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        text = log.read_text()
        if "\napi key: " in text:
            found = {}
            for line in text.splitlines():
                label, sep, rest = line.partition(": ")
                if sep and label in ("gateway", "openai", "prometheus", "api key"):
                    found[label] = rest.split()[0]
            return found
        if proc.poll() is not None:
            pytest.fail(f"serve exited with {proc.returncode} before it was ready:\n{text[-4000:]}")
        time.sleep(0.2)  # polling a log file: the process gives no other signal of readiness
    pytest.fail(f"serve printed no access lines within {READY_S} s:\n{log.read_text()[-4000:]}")


def test_serve_smollm2_answers_through_the_openai_sdk(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    with served(tmp_path, "smollm2", "minilm", "--port", "0", "--http-port", "0", "--api-key", "k1") as lines:
        assert lines["api key"] == "k1"
        client = openai.OpenAI(base_url=lines["openai"], api_key="k1", max_retries=0, timeout=120)
        assert {m.id for m in client.models.list().data} >= {"smollm2", "minilm"}
        reply = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=16,
        )
        assert "Paris" in reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
        vectors = client.embeddings.create(model="minilm", input=["a sentence", "another one"])
        assert [len(d.embedding) for d in vectors.data] == [384, 384]
        _logprobs_and_choices(client)
        _structured_replies(client)
        _a_forced_call_over_grpc(lines["gateway"].split()[0], "k1")


def _logprobs_and_choices(client: Any) -> None:
    """The real SmolLM2's logprobs (greedy: each token the likeliest) and two seeded choices."""
    question = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(
        model="smollm2", messages=question, temperature=0, max_tokens=8, logprobs=True, top_logprobs=5
    )
    content = reply.choices[0].logprobs.content
    # Every generated token has its entry, the EOS that ended the reply too (as its token ids do).
    assert "".join(e.token for e in content) == reply.choices[0].message.content + "<|im_end|>"
    assert all(e.token == e.top_logprobs[0].token and len(e.top_logprobs) == 5 for e in content)
    assert -20.0 < sum(e.logprob for e in content) <= 0.0  # a likely answer to the model itself
    two = client.chat.completions.create(
        model="smollm2", messages=question, temperature=1.0, seed=1, max_tokens=12, n=2
    )
    assert [c.index for c in two.choices] == [0, 1] and all(c.message.content for c in two.choices)
    assert two.usage.prompt_tokens == reply.usage.prompt_tokens  # the prompt counted once
    assert 2 <= two.usage.completion_tokens <= 24


def _a_forced_call_over_grpc(address: str, api_key: str) -> None:
    """gRPC's Chat with tool_choice naming a tool: the call comes back as fields of the last message."""
    import grpc

    from hanzo.inference.v1 import inference_pb2, inference_pb2_grpc

    tool = WEATHER["function"]
    request = inference_pb2.ChatRequest(
        model="smollm2",
        messages=[inference_pb2.ChatMessage(role="user", content="What is the weather in Paris right now?")],
        tools=[inference_pb2.Tool(name=tool["name"], description=tool["description"],
                                  parameters_json=json.dumps(tool["parameters"]))],
        tool_choice="get_weather",
        sampling=inference_pb2.SamplingParams(temperature=0.0, max_tokens=60),
    )  # fmt: skip
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        responses = list(stub.Chat(request, metadata=(("authorization", f"Bearer {api_key}"),), timeout=120))
    last = responses[-1]
    assert last.finish_reason == inference_pb2.FINISH_REASON_TOOL_CALLS
    (call,) = last.tool_calls
    assert call.name == "get_weather" and "paris" in json.loads(call.arguments)["city"].lower()


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def _structured_replies(client: Any) -> None:
    """The real SmolLM2's replies under a JSON schema (OpenAI's response_format) and a vLLM choice."""
    jsonschema = pytest.importorskip("jsonschema")
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Anna is 34 and lives in Oslo. Give her name, age and city."}],
        temperature=0,
        max_tokens=80,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    person = json.loads(reply.choices[0].message.content)
    jsonschema.validate(person, PERSON)
    assert reply.choices[0].finish_reason == "stop"
    picked = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
        temperature=0,
        max_tokens=8,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert picked.choices[0].message.content in ("yes", "no")
    _tool_call_and_its_result(client, jsonschema)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def _tool_call_and_its_result(client: Any, jsonschema: Any) -> None:
    """The real SmolLM2 made to call a tool, then answering from the tool's result."""
    question = {"role": "user", "content": "What is the weather in Paris right now?"}
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[question],
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "sunny"}'}
    answer = client.chat.completions.create(
        model="smollm2",
        messages=[question, {"role": "assistant", "tool_calls": [call.model_dump()]}, result],
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_tokens=40,
    )
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_serve_a_checkpoint_directory_under_a_name(tmp_path: Path, llama_gqa_dir: Path) -> None:
    openai = pytest.importorskip("openai")
    argv = [str(llama_gqa_dir), "--name", "tiny", "--port", "0", "--http-port", "0", "--max-model-len", "512"]
    with served(tmp_path, *argv) as lines:
        assert lines["gateway"].startswith("127.0.0.1:")
        client = openai.OpenAI(base_url=lines["openai"], api_key=lines["api key"], max_retries=0, timeout=60)
        out = client.completions.create(
            model="tiny", prompt="The quick brown fox", max_tokens=5, temperature=0
        )
        assert out.usage.completion_tokens >= 1
        with pytest.raises(openai.BadRequestError):  # the context was cut to 512 tokens
            client.completions.create(model="tiny", prompt=[5] * 600, max_tokens=5)


@pytest.mark.parametrize(
    ("models", "names", "words"),
    [
        (["no-such-model"], [], "no-such-model"),
        (["smollm2", "smollm2"], [], "name them apart with --name"),
        (["smollm2"], ["a", "b"], "--name was given 2 times for 1 models"),
    ],
)
def test_serve_refuses_models_it_cannot_resolve(models: list[str], names: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        serving_models(models, names)


def test_serve_command_line_fails_in_one_line_for_an_unknown_model(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "services.mesh", "serve", str(tmp_path / "nothing-here")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr


def test_serve_options_become_worker_settings() -> None:
    args = build_parser().parse_args(
        ["serve", "smollm2", "--dtype", "bfloat16", "--max-model-len", "2048", "--kv-cache-gib", "0.5"]
    )
    assert (args.workers, args.port, args.http_port) == (1, 50050, 8000)
    assert worker_env(args) == {
        "HANZO_WORKER_DTYPE": "bfloat16",
        "HANZO_WORKER_MAX_MODEL_LEN": "2048",
        "HANZO_WORKER_KV_CACHE_BYTES": str(1 << 29),
    }
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "smollm2", "--max-model-len", "1"])


def test_access_lines_name_the_openai_base_url_and_key() -> None:
    text = access_lines("127.0.0.1:1", "127.0.0.1:2", "key")
    assert text.splitlines() == [
        "gateway: 127.0.0.1:1  (metadata authorization: Bearer key)",
        "openai: http://127.0.0.1:2/v1  (Authorization: Bearer key)",
        "api key: key",
    ]
