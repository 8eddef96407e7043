"""POST /v1/completions: OpenAI's legacy completion body (one prompt, text or token ids) as a
GenerateRequest, and the reply in OpenAI's text_completion shape."""

from __future__ import annotations

from hanzo.inference.v1 import inference_pb2
from services.gateway.openai.errors import invalid
from services.gateway.openai.logprobs import completion_logprobs
from services.gateway.openai.sampling import fill_generate, fill_logprobs
from services.gateway.openai.schemas import Completion, CompletionChoice, CompletionRequest
from services.gateway.openai.streaming import Chunks, Outcome, total_usage, usage_of


def to_generate(body: CompletionRequest) -> inference_pb2.GenerateRequest:
    """The request to route; HttpError (400) naming the field for what the mesh cannot serve. With no
    max_tokens the worker's default of 16 applies, as OpenAI's and vLLM's completions default to."""
    if body.echo:
        raise invalid("echo", "is not supported by this server")
    if body.suffix:
        raise invalid("suffix", "is not supported by this server")
    if body.best_of is not None and body.best_of != 1:
        raise invalid("best_of", "only 1 is supported")
    request = inference_pb2.GenerateRequest(model=body.model)
    prompt = _one_prompt(body.prompt)
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.SetInParent()  # an empty list still selects token ids (and is refused)
        request.prompt_token_ids.ids.extend(prompt)
    fill_generate(body, request, body.max_tokens)
    fill_logprobs(request.sampling, "logprobs", body.logprobs)
    return request


def fill_default_budget(request: inference_pb2.GenerateRequest) -> None:
    """Nothing to fill: the proto's unset max_tokens (16) is the completions default."""


def reply(outcomes: list[Outcome], request_id: str, created: int, body: CompletionRequest) -> Completion:
    """The non-streamed text_completion for a finished generation: a choice per outcome."""
    return Completion.model_construct(
        id=f"cmpl-{request_id}",
        object="text_completion",
        created=created,
        model=body.model,
        choices=[
            CompletionChoice.model_construct(
                index=index,
                text=outcome.text,
                logprobs=completion_logprobs(outcome.logprobs)[0] if body.logprobs is not None else None,
                finish_reason=outcome.finish_reason,
                stop_reason=outcome.stop_reason,
            )
            for index, outcome in enumerate(outcomes)
        ],
        usage=usage_of(total_usage(o.usage for o in outcomes)),
    )


def chunks(request_id: str, created: int, model: str) -> Chunks:
    """The stream's chunk writer: text_completion objects carrying text."""
    return Chunks(f"cmpl-{request_id}", "text_completion", created, model, chat=False)


def _one_prompt(prompt: str | list) -> str | list[int]:
    """The single prompt a body carries (a string, token ids, or a list holding one of either)."""
    if isinstance(prompt, str):
        return prompt
    if not prompt or isinstance(prompt[0], int):
        return prompt  # token ids (an empty list is refused by the request path, naming prompt)
    if len(prompt) != 1:
        raise invalid("prompt", f"holds {len(prompt)} prompts; send one prompt per request")
    return prompt[0]
