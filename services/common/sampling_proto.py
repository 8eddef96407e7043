"""A request's SamplingParams message as the engine's SamplingParams: what the worker serves with and
what the gateway builds to refuse bad values before placing a request."""

from __future__ import annotations

from hanzo.inference.v1 import inference_pb2
from services.common.errors import InvalidArgument
from services.common.sampling import SamplingParams
from services.common.structured import FIELD, StructuredOutput, StructureKind


def sampling_params(proto: inference_pb2.SamplingParams) -> SamplingParams:
    """A request's sampling parameters; unset fields keep the defaults. InvalidArgument on bad values."""
    kwargs: dict[str, object] = {
        "stop": tuple(proto.stop),
        "stop_token_ids": tuple(proto.stop_token_ids),
        "ignore_eos": proto.ignore_eos,
        "min_tokens": proto.min_tokens,
        "presence_penalty": proto.presence_penalty,
        "frequency_penalty": proto.frequency_penalty,
        "min_p": proto.min_p,
        "logit_bias": tuple(sorted(proto.logit_bias.items())),  # a map's order is not the wire's
    }
    for name in ("temperature", "top_p", "max_tokens", "seed", "repetition_penalty", "logprobs", "n"):
        if proto.HasField(name):
            kwargs[name] = getattr(proto, name)
    if proto.HasField("top_k") and proto.top_k > 0:
        kwargs["top_k"] = proto.top_k
    if proto.HasField("structured"):
        kwargs["structured"] = structured_output(proto.structured)
    return SamplingParams(**kwargs)  # type: ignore[arg-type]


def structured_output(proto: inference_pb2.StructuredOutput) -> StructuredOutput:
    """The message as a StructuredOutput; InvalidArgument when no constraint is set or it is malformed."""
    constraint = proto.WhichOneof("constraint")
    strict = not proto.allow_extra_properties
    if constraint == "json_object":
        return StructuredOutput(StructureKind.JSON_OBJECT)
    if constraint == "json_schema":
        return StructuredOutput(StructureKind.JSON_SCHEMA, proto.json_schema, strict=strict)
    if constraint == "regex":
        return StructuredOutput(StructureKind.REGEX, proto.regex)
    if constraint == "choice":
        return StructuredOutput(StructureKind.CHOICE, choices=tuple(proto.choice.values))
    raise InvalidArgument(FIELD, "set one of json_object, json_schema, regex or choice")
