"""OpenAI's (and vLLM's) sampling fields as the mesh's SamplingParams, and the generate request fields
both text endpoints share; a field the mesh cannot honour is refused with a 400 naming it."""

from __future__ import annotations

import json

from hanzo.inference.v1 import inference_pb2
from services.common.sampling import MAX_CHOICES, MAX_LOGPROBS
from services.gateway.classify import from_name
from services.gateway.openai.errors import invalid
from services.gateway.openai.schemas import SamplingFields

_SEED_MASK = 2**64 - 1  # the proto's seed is unsigned; OpenAI's may be negative


def fill_generate(
    body: SamplingFields, request: inference_pb2.GenerateRequest, max_tokens: int | None
) -> None:
    """Set request's sampling, tenant and workload class from body. max_tokens: the output budget the
    endpoint resolved (None: the worker's default). HttpError (400) for what cannot be served."""
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options", "is only allowed with stream=true")
    sampling = request.sampling
    if body.temperature is not None:
        sampling.temperature = body.temperature
    if body.top_p is not None:
        sampling.top_p = body.top_p
    if body.top_k is not None and body.top_k > 0:  # vLLM's 0 and -1 both mean no top-k cut
        sampling.top_k = body.top_k
    if max_tokens is not None:
        sampling.max_tokens = max_tokens
    if body.seed is not None:
        sampling.seed = body.seed & _SEED_MASK
    if body.n is not None:
        if not 0 < body.n < 2**32:
            raise invalid("n", f"must be an integer in [1, {MAX_CHOICES}], got {body.n}")
        sampling.n = body.n
    if body.stop:
        sampling.stop.extend([body.stop] if isinstance(body.stop, str) else body.stop)
    if body.stop_token_ids:
        sampling.stop_token_ids.extend(body.stop_token_ids)
    sampling.ignore_eos = body.ignore_eos
    sampling.min_tokens = body.min_tokens
    _fill_logit_controls(body, sampling)
    _fill_structured(body, sampling)
    if body.user:
        request.tenant = body.user  # OpenAI's end-user id: the engine shares a class's seats by tenant
    if body.workload_class:
        request.workload_class = int(from_name(body.workload_class, "workload_class"))


def _fill_logit_controls(body: SamplingFields, sampling: inference_pb2.SamplingParams) -> None:
    """Penalties, min_p and logit_bias; their ranges are checked with the rest of the sampling fields
    (services/common/sampling.py), so both APIs refuse the same values with the same message."""
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"):
        value = getattr(body, name)
        if value is not None:
            setattr(sampling, name, value)
    for key, bias in (body.logit_bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise invalid("logit_bias", f"keys are token ids, got {key!r}") from None
        if not 0 <= token < 2**32:
            raise invalid("logit_bias", f"token ids must be in [0, 2^32), got {token}")
        sampling.logit_bias[token] = bias


def _fill_structured(body: SamplingFields, sampling: inference_pb2.SamplingParams) -> None:
    """response_format or one guided_* field as the proto's StructuredOutput (at most one may be set);
    the worker compiles it and refuses, naming response_format, what its grammar compiler cannot take."""
    given = [
        name for name in ("guided_json", "guided_regex", "guided_choice") if getattr(body, name) is not None
    ]
    response_format = body.response_format
    if response_format is not None and response_format.type != "text":
        given.insert(0, "response_format")
    if len(given) > 1:
        raise invalid(given[1], f"only one structured output constraint per request; {given[0]} is set too")
    if not given:
        return
    structured = sampling.structured
    if given[0] == "response_format":
        assert response_format is not None
        if response_format.type == "json_object":
            structured.json_object = True
            return
        schema = response_format.json_schema
        if schema is None or schema.schema_ is None:
            raise invalid(
                "response_format", "type json_schema needs json_schema.schema, a JSON Schema object"
            )
        structured.json_schema = json.dumps(schema.schema_)
        structured.allow_extra_properties = schema.strict is False
    elif given[0] == "guided_json":
        value = body.guided_json
        structured.json_schema = value if isinstance(value, str) else json.dumps(value)
    elif given[0] == "guided_regex":
        structured.regex = body.guided_regex or ""
    else:
        structured.choice.values.extend(body.guided_choice or [])


def fill_logprobs(sampling: inference_pb2.SamplingParams, param: str, top: int | None) -> None:
    """Ask for logprobs with top alternatives per token (None: none); a 400 naming param when out of
    range, as the endpoint names the field (chat's top_logprobs, completions' logprobs)."""
    if top is None:
        return
    if not 0 <= top <= MAX_LOGPROBS:
        raise invalid(param, f"must be an integer in [0, {MAX_LOGPROBS}], got {top}")
    sampling.logprobs = top


def include_usage(body: SamplingFields) -> bool:
    """Whether a stream ends with a usage chunk (stream_options.include_usage)."""
    return body.stream_options is not None and body.stream_options.include_usage
