"""Protobuf <-> engine types at the worker's edge (sampling parameters: services/common/sampling.py)."""

from __future__ import annotations

from hanzo.inference.v1 import inference_pb2
from services.common.errors import InvalidArgument

FINISH_REASONS = {
    "stop": inference_pb2.FINISH_REASON_STOP,
    "length": inference_pb2.FINISH_REASON_LENGTH,
    "abort": inference_pb2.FINISH_REASON_ABORT,
}


def prompt_of(request: inference_pb2.GenerateRequest) -> str | list[int]:
    """The text or token ids to complete; InvalidArgument when neither is given."""
    which = request.WhichOneof("input")
    if which == "prompt":
        return request.prompt
    if which == "prompt_token_ids":
        return list(request.prompt_token_ids.ids)
    raise InvalidArgument("prompt", "missing: set prompt (text) or prompt_token_ids")
