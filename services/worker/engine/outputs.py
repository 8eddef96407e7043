"""What the engine hands back per step, and the per-request text state behind it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from services.worker.engine.errors import EngineError
from services.worker.engine.sequence import FinishReason, Sequence, TokenLogprob
from services.worker.models.tokenizer import IncrementalDecoder, Tokenizer


@dataclass
class RequestOutput:
    """One request's progress in one step: the new tokens and text since its previous output."""

    request_id: str
    new_token_ids: list[int]
    new_text: str  # "" when the request was added with detokenize=False
    finished: bool
    finish_reason: str | None  # "stop", "length" or "abort" once finished
    stop_reason: str | int | None  # once finished: the stop string or stop token id that ended it
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    arrival_time: float  # monotonic, when the engine accepted the request
    first_scheduled_time: float | None  # monotonic, when it first left the queue
    num_preemptions: int  # times it was preempted (its KV dropped, recomputed on resuming)
    first_budget: int | None  # the token budget of the step that first scheduled it
    first_nested: bool  # that step ran nested between another step's layers (layer-level preemption)
    error: EngineError | None = None  # set when the engine refused the request (finished, no tokens)
    # With params.logprobs set: one per new_token_ids entry (else None).
    new_logprobs: list[TokenLogprob] | None = None


class TextState:
    """Incremental detokenization and stop-string matching for one request.

    Text that could still turn out to be the start of a stop string is held back (at most the longest
    stop string minus one character), so a stop string is never streamed and then taken back.
    """

    def __init__(self, tokenizer: Tokenizer, seq: Sequence) -> None:
        self.decoder = IncrementalDecoder(tokenizer, seq.token_ids[: seq.num_prompt_tokens])
        self.stops = seq.params.stop
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.sent = 0  # characters of self.text already returned

    def push(self, token_id: int, finished: bool) -> tuple[str, str | None]:
        """Feed one token; returns (text delta to send, the stop string that ended the output or None)."""
        delta = self.decoder.push(token_id)
        if finished:
            delta += self.decoder.flush()
        search_from = max(0, len(self.text) - self.hold)
        self.text += delta
        for stop in self.stops:
            at = self.text.find(stop, search_from)
            if at >= 0:
                self.text = self.text[:at]
                return self._take(len(self.text)), stop
        return self._take(len(self.text) if finished else len(self.text) - self.hold), None

    def _take(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out = self.text[self.sent : upto]
        self.sent = upto
        return out


def make_output(
    seq: Sequence, new_token_ids: list[int], new_text: str, error: EngineError | None = None
) -> RequestOutput:
    """Snapshot of seq after a step."""
    reason = seq.finish_reason
    logprobs = None
    if seq.params.logprobs is not None:
        logprobs = [seq.logprob] if new_token_ids and seq.logprob is not None else []
    return RequestOutput(
        request_id=seq.request_id,
        new_token_ids=new_token_ids,
        new_text=new_text,
        finished=seq.is_finished,
        finish_reason=None if reason is None else reason.value,
        stop_reason=seq.stop_reason if seq.is_finished else None,
        num_prompt_tokens=seq.num_prompt_tokens,
        num_output_tokens=seq.num_output_tokens,
        num_cached_tokens=seq.num_cached_tokens,
        arrival_time=seq.arrival_time,
        first_scheduled_time=seq.first_scheduled_time,
        num_preemptions=seq.num_preemptions,
        first_budget=seq.first_budget,
        first_nested=seq.first_nested,
        error=error,
        new_logprobs=logprobs,
    )


def merge(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """Two consecutive outputs of one request as one: deltas joined, state from the later."""
    return dataclasses.replace(
        later,
        new_token_ids=earlier.new_token_ids + later.new_token_ids,
        new_text=earlier.new_text + later.new_text,
        new_logprobs=None
        if later.new_logprobs is None
        else (earlier.new_logprobs or []) + later.new_logprobs,
    )


__all__ = ["FinishReason", "RequestOutput", "TextState", "TokenLogprob", "make_output", "merge"]
