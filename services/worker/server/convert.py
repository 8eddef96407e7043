"""Protobuf <-> engine types at the worker's edge (sampling parameters: services/common/sampling.py)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

from hanzo.inference.v1 import inference_pb2
from services.common.errors import InvalidArgument
from services.worker.engine.sequence import TokenLogprob
from services.worker.models.tokenizer import Tokenizer

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


TokenText = Callable[[int], str]
_TEXTS: weakref.WeakKeyDictionary[Tokenizer, dict[int, str]] = weakref.WeakKeyDictionary()


def token_texts(tokenizer: Tokenizer | None) -> TokenText:
    """Each token id's own text (special tokens included, as logprobs show them), remembered per
    tokenizer: a logprobs request names up to 21 tokens per generated one, mostly the same few."""
    if tokenizer is None:
        return lambda token_id: ""
    texts = _TEXTS.setdefault(tokenizer, {})

    def text(token_id: int) -> str:
        found = texts.get(token_id)
        if found is None:
            found = texts[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
        return found

    return text


def logprobs_message(entries: Sequence[TokenLogprob], text: TokenText) -> list[inference_pb2.TokenLogprobs]:
    """The engine's per-token logprobs as GenerateResponse.logprobs entries."""
    return [
        inference_pb2.TokenLogprobs(
            logprob=entry.logprob,
            rank=entry.rank,
            token=text(entry.token_id),
            top_logprobs=[
                inference_pb2.TopLogprob(token_id=t, logprob=v, token=text(t)) for t, v in entry.top
            ],
        )
        for entry in entries
    ]
