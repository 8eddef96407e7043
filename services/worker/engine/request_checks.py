"""What LLMEngine.add_request checks before queueing a request, each failure an InvalidRequestError
naming the field: the prompt (present, inside the vocabulary, leaving room to generate) and what the
sampling parameters can only be checked against with the model at hand."""

from __future__ import annotations

from services.common.sampling import SamplingParams
from services.worker.engine.errors import InvalidRequestError
from services.worker.models.tokenizer import Tokenizer


def check_params(params: SamplingParams, vocab: int) -> None:
    """Refuse what SamplingParams' own checks cannot know: the vocabulary, and n (the engine runs one
    sequence per request; choices are fanned out before it, worker/engine/choices.py)."""
    if params.n != 1:
        raise InvalidRequestError("n", f"the engine runs one choice per request, got n={params.n}")
    outside = next((t for t, _ in params.logit_bias if t >= vocab), None)
    if outside is not None:
        raise InvalidRequestError("logit_bias", f"token id {outside} is outside the vocabulary [0, {vocab})")


def prompt_token_ids(
    prompt: str | list[int], tokenizer: Tokenizer | None, vocab: int, max_model_len: int
) -> list[int]:
    """The prompt's token ids (text encoded with tokenizer)."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt", "is empty; send at least one character or token id")
        if tokenizer is None:
            raise InvalidRequestError("prompt", "this model has no tokenizer.json; send prompt_token_ids")
        token_ids = tokenizer.encode(prompt)
    else:
        token_ids = list(prompt)
    if not token_ids:
        raise InvalidRequestError("prompt", "is empty; send at least one token")
    bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidRequestError(
            "prompt_token_ids", f"token id {bad!r} is outside the vocabulary [0, {vocab})"
        )
    if len(token_ids) >= max_model_len:
        raise InvalidRequestError(
            "prompt",
            f"{len(token_ids)} tokens leave no room to generate: "
            f"the model's context is {max_model_len} tokens",
        )
    return token_ids
