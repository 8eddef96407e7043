"""A request's SamplingParams message as the engine's SamplingParams: what the worker serves with and
what the gateway builds to refuse bad values before placing a request."""

from __future__ import annotations

from hanzo.inference.v1 import inference_pb2
from services.common.sampling import SamplingParams


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
    for name in ("temperature", "top_p", "max_tokens", "seed", "repetition_penalty"):
        if proto.HasField(name):
            kwargs[name] = getattr(proto, name)
    if proto.HasField("top_k") and proto.top_k > 0:
        kwargs["top_k"] = proto.top_k
    return SamplingParams(**kwargs)  # type: ignore[arg-type]
