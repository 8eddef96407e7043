"""Offline batch generation in the style of vLLM's `LLM` class."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

from services.common.sampling import SamplingParams
from services.worker.engine.config import EngineConfig
from services.worker.engine.errors import InvalidRequestError
from services.worker.engine.llm_engine import LLMEngine
from services.worker.engine.sequence import TokenLogprob


@dataclass
class CompletionOutput:
    """The whole result of one prompt."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" or "length"
    num_cached_tokens: int
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it (not EOS)
    logprobs: list[TokenLogprob] | None = None  # with params.logprobs: one per token_ids entry


class LLM:
    """`LLM(model_dir, **engine_options).generate(prompts, params)`; options are EngineConfig fields."""

    def __init__(self, model_dir: str | Path, **engine_options: object) -> None:
        self.engine = LLMEngine(model_dir, EngineConfig(**engine_options))  # type: ignore[arg-type]
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | list[int] | Seq[str | list[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        """One output per prompt, in order. Prompts are strings or lists of token ids."""
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        params = params or SamplingParams()
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(prompts):
            raise InvalidRequestError(
                "sampling", f"{len(per_prompt)} SamplingParams for {len(prompts)} prompts"
            )
        engine = self.engine
        request_ids = [f"offline-{next(self._ids)}" for _ in prompts]
        added = []
        try:
            for request_id, prompt, p in zip(request_ids, prompts, per_prompt, strict=True):
                # Offline callers get the text once at the end; streaming deltas would only cost time here.
                added.append(engine.add_request(request_id, prompt, p, detokenize=False))
        except Exception:
            for seq in added:
                engine.abort_request(seq.request_id)
            raise
        texts: dict[str, list[str]] = {rid: [] for rid in request_ids}
        logprobs: dict[str, list[TokenLogprob]] = {rid: [] for rid in request_ids}
        while engine.has_unfinished_requests():
            for out in engine.step():
                texts[out.request_id].append(out.new_text)
                logprobs[out.request_id] += out.new_logprobs or ()
        tokenizer = engine.tokenizer
        results = []
        for seq in added:
            output_ids = seq.output_token_ids
            if seq.params.stop:
                text = "".join(texts[seq.request_id])
            else:
                text = tokenizer.decode(output_ids) if tokenizer is not None else ""
            results.append(
                CompletionOutput(
                    request_id=seq.request_id,
                    prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
                    token_ids=output_ids,
                    text=text,
                    finish_reason=seq.finish_reason.value if seq.finish_reason else "length",
                    num_cached_tokens=seq.num_cached_tokens,
                    stop_reason=seq.stop_reason,
                    logprobs=logprobs[seq.request_id] if seq.params.logprobs is not None else None,
                )
            )
        return results
