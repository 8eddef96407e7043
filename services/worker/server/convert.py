"""Protobuf <-> engine types at the worker's edge (the gateway validates with the same functions)."""

from __future__ import annotations

from hanzo.inference.v1 import inference_pb2
from services.common.errors import InvalidArgument
from services.worker.engine.sampling_params import SamplingParams

FINISH_REASONS = {
    "stop": inference_pb2.FINISH_REASON_STOP,
    "length": inference_pb2.FINISH_REASON_LENGTH,
    "abort": inference_pb2.FINISH_REASON_ABORT,
}


def sampling_params(proto: inference_pb2.SamplingParams) -> SamplingParams:
    """Engine sampling parameters; unset fields keep engine defaults. InvalidRequestError on bad values."""
    kwargs: dict[str, object] = {
        "stop": tuple(proto.stop),
        "stop_token_ids": tuple(proto.stop_token_ids),
        "ignore_eos": proto.ignore_eos,
        "min_tokens": proto.min_tokens,
    }
    for name in ("temperature", "top_p", "max_tokens", "seed"):
        if proto.HasField(name):
            kwargs[name] = getattr(proto, name)
    if proto.HasField("top_k") and proto.top_k > 0:
        kwargs["top_k"] = proto.top_k
    return SamplingParams(**kwargs)  # type: ignore[arg-type]


def prompt_of(request: inference_pb2.GenerateRequest) -> str | list[int]:
    """The text or token ids to complete; InvalidArgument when neither is given."""
    which = request.WhichOneof("input")
    if which == "prompt":
        return request.prompt
    if which == "prompt_token_ids":
        return list(request.prompt_token_ids.ids)
    raise InvalidArgument("prompt", "missing: set prompt (text) or prompt_token_ids")
