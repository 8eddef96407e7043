"""Request state as the scheduler sees it: token ids, progress, block table. No torch here."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from services.common.sampling import SamplingParams
from services.worker.engine.policy.classes import DEFAULT_HINTS, SchedulingHints


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to recompute
    RUNNING = "running"  # holds KV blocks and is scheduled every step
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens reached, or the model's context is full
    ABORT = "abort"  # the caller went away or asked to stop


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log probability, its rank (1: the likeliest) and the likeliest
    alternatives as (token id, log probability), likeliest first (worker/engine/logprobs.py)."""

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


class Sequence:
    """One generation request. `token_ids` holds the prompt followed by every generated token.

    num_computed_tokens counts the leading tokens whose KV is in the cache; the scheduler advances it
    after each step. A preempted sequence drops its blocks and starts again from 0 (recompute).
    """

    __slots__ = (
        "admit_no",
        "arrival_time",
        "block_hashes",
        "block_table",
        "eos_token_ids",
        "finish_reason",
        "first_budget",
        "first_nested",
        "first_scheduled_time",
        "hints",
        "logprob",
        "matcher",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "params",
        "priority",
        "request_id",
        "status",
        "stop_reason",
        "token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: frozenset[int] = frozenset(),
        arrival_time: float | None = None,
        hints: SchedulingHints = DEFAULT_HINTS,
    ) -> None:
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_scheduled_time: float | None = None  # monotonic; when it first left the queue
        # The scheduler's decision for its first step: that step's token budget, and whether the step ran
        # nested between the layers of another (layer-level preemption). For traces.
        self.first_budget: int | None = None
        self.first_nested = False
        self.hints = hints
        self.priority = 0  # the scheduler's policy sets the level at add(); 0 is served first
        self.admit_no = 0  # order of the latest admission; the most recent is preempted first
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None  # the stop string or stop token id that ended it
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at the last admission
        self.num_preemptions = 0
        self.block_table: list[int] = []
        # Chained hashes of the leading full blocks already registered in the prefix cache.
        self.block_hashes: list[int] = []
        # The grammar matcher following the output (worker/engine/grammar.py) when the request asked
        # for structured output; None otherwise.
        self.matcher: object | None = None
        # The latest sampled token's logprobs when params.logprobs is set; the step's output takes it.
        self.logprob: TokenLogprob | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
