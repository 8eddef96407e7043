"""Structured output in the engine: whatever a (random-weight) model would say, the text it returns
matches the requested choice, regular expression or JSON schema; a spec the grammar compiler refuses
is InvalidRequestError with its reason; AsyncLLM compiles off the engine thread; constrained and free
rows share steps."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import jsonschema
import pytest

from services.common.errors import InvalidArgument
from services.common.sampling import SamplingParams
from services.common.structured import StructuredOutput, StructureKind
from services.worker.engine import LLM
from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.errors import InvalidRequestError

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "size": {"enum": [1, 2, 3]},
    },
    "required": ["color", "ok", "size"],
    "additionalProperties": False,
}
SPECS = {
    "choice": StructuredOutput(StructureKind.CHOICE, choices=("alpha", "beta gamma", "d")),
    "regex": StructuredOutput(StructureKind.REGEX, r"[0-9]{3}-[a-c]{2}"),
    "schema": StructuredOutput(StructureKind.JSON_SCHEMA, json.dumps(SCHEMA)),
}


def _check(kind: str, text: str) -> None:
    if kind == "choice":
        assert text in SPECS["choice"].choices
    elif kind == "regex":
        assert re.fullmatch(SPECS["regex"].spec, text), text
    else:
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_outputs_take_the_requested_shape_beside_free_rows(llama_gqa_dir: Path, temperature: float) -> None:
    llm = LLM(llama_gqa_dir, max_num_batched_tokens=64)
    kinds = [*SPECS, *SPECS, "free"]
    params = [
        SamplingParams(temperature=temperature, seed=i, max_tokens=40, structured=SPECS.get(kind))
        for i, kind in enumerate(kinds)
    ]
    outputs = llm.generate(["Answer:", "Say something", "x" * 40, "a", "b b b", "0", "free text"], params)
    for kind, out in zip(kinds, outputs, strict=True):
        if kind != "free":
            assert out.finish_reason == "stop", (kind, out.text)  # the grammar ended it, not max_tokens
            _check(kind, out.text)
    assert llm.engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (StructuredOutput(StructureKind.JSON_SCHEMA, '{"type": "no-such-type"}'), "cannot be compiled"),
        (StructuredOutput(StructureKind.REGEX, "(unclosed"), "cannot be compiled"),
    ],
)
def test_a_spec_the_compiler_refuses_names_why(
    llama_gqa_dir: Path, spec: StructuredOutput, words: str
) -> None:
    llm = LLM(llama_gqa_dir)
    with pytest.raises(InvalidRequestError, match=words) as raised:
        llm.engine.add_request("r", [5, 6], SamplingParams(structured=spec))
    assert raised.value.field == "structured_output"
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"kind": StructureKind.JSON_SCHEMA, "spec": "{not json"}, "not valid JSON"),
        ({"kind": StructureKind.JSON_SCHEMA, "spec": "[1]"}, "must be a JSON object"),
        ({"kind": StructureKind.REGEX}, "is empty"),
        ({"kind": StructureKind.CHOICE, "choices": ("a", "")}, "non-empty strings"),
    ],
)
def test_malformed_specs_are_refused_before_any_compiler(fields: dict, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        StructuredOutput(**fields)


async def test_async_llm_compiles_off_the_engine_thread(llama_gqa_dir: Path) -> None:
    engine = LLM(llama_gqa_dir).engine
    compiled_on = []
    compile_ = engine.grammars.compile

    def recording(params: SamplingParams) -> object:
        compiled_on.append(threading.current_thread())
        return compile_(params)

    engine.grammars.compile = recording  # type: ignore[method-assign]
    async with AsyncLLM(engine) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=40, structured=SPECS["regex"])
        outputs = [o async for o in llm.generate([7, 8, 9], params)]
        _check("regex", "".join(o.new_text for o in outputs))
        assert compiled_on and all(t is not llm._thread for t in compiled_on)
        bad = SamplingParams(structured=StructuredOutput(StructureKind.REGEX, "(unclosed"))
        with pytest.raises(InvalidRequestError, match="cannot be compiled"):
            _ = [o async for o in llm.generate([7, 8], bad)]
        await asyncio.wait_for(llm.wait_idle(), 10)
