"""Per-request sampling parameters, validated at construction: the engine samples with them, and the
gateway builds them from a request (sampling_proto.py) to refuse bad values before placing it, so both
apply the same rules. No protobuf here: the engine runs without the generated code."""

from __future__ import annotations

from dataclasses import dataclass, replace

from services.common.errors import InvalidArgument
from services.common.structured import StructuredOutput

MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs and vLLM's default max_logprobs
MAX_CHOICES = 16  # n: each choice holds its own KV for its output, so one request's share is bounded


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request.

    temperature: 0 means greedy; > 0 scales logits. top_p in (0, 1]; top_k: None or >= 1 (no cut).
    seed: None for the engine's generator, else a per-request generator (same seed, same output).
    max_tokens: >= 1 new tokens. stop: strings that end the output and are not returned in the text.
    stop_token_ids: extra token ids that end the output (the token is kept in token_ids, not in text).
    ignore_eos: keep generating past the model's EOS ids. min_tokens: until this many new tokens exist,
    neither an EOS id nor a stop_token_ids id is sampled (so neither can end the output); stop strings
    still apply, as in vLLM.

    Logit controls, applied in this order before temperature, as vLLM and OpenAI define them:
    logit_bias: (token id, bias in [-100, 100]) pairs added to those logits. repetition_penalty > 0
    (1: none): a logit of any token already in the prompt or the output is divided by it where
    positive, multiplied where negative (transformers' and vLLM's rule). frequency_penalty and
    presence_penalty in [-2, 2] (0: none): a logit drops by frequency_penalty x how often the token is in
    the output so far, plus presence_penalty if it is there at all (the prompt does not count). Then,
    after temperature, min_p in [0, 1] (0: none) drops tokens less likely than min_p x the likeliest.
    structured: the output's required shape (None: free text); each step only tokens that keep the
    output a prefix of that shape can be sampled.

    logprobs: None for none, else in [0, MAX_LOGPROBS]: each generated token comes with its log
    probability, its rank and this many likeliest alternatives. They are the model's own (a log-softmax
    of its raw logits, before bias, penalties, bans, grammar and temperature), as vLLM's default.
    n: choices in [1, MAX_CHOICES] from the one prompt (the servers fan them out; the prompt's KV is
    computed once and shared through the prefix cache); with a seed, choice i uses seed + i.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    structured: StructuredOutput | None = None
    logprobs: int | None = None
    n: int = 1

    def __post_init__(self) -> None:
        # Lists are accepted for convenience and frozen into tuples so params can be shared safely.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        try:
            object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in bias))
        except (TypeError, ValueError):
            raise InvalidArgument("logit_bias", "must map token ids (integers) to biases (numbers)") from None
        self._check_logit_controls()
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise InvalidArgument(
                "logprobs", f"must be an integer in [0, {MAX_LOGPROBS}] or unset, got {self.logprobs!r}"
            )
        if not isinstance(self.n, int) or not 1 <= self.n <= MAX_CHOICES:
            raise InvalidArgument("n", f"must be an integer in [1, {MAX_CHOICES}], got {self.n!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidArgument("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidArgument(
                "min_tokens",
                f"must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}",
            )
        if self.temperature < 0:
            raise InvalidArgument("temperature", f"must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgument("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise InvalidArgument("top_k", f"must be >= 1 or unset, got {self.top_k}")
        if any(not s for s in self.stop):
            raise InvalidArgument("stop", "stop strings must be non-empty")
        if any(t < 0 for t in self.stop_token_ids):
            raise InvalidArgument("stop_token_ids", "token ids must be >= 0")

    def _check_logit_controls(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise InvalidArgument(name, f"must be in [-2, 2] (0: none), got {value}")
        if not self.repetition_penalty > 0.0 or self.repetition_penalty == float("inf"):
            raise InvalidArgument(
                "repetition_penalty", f"must be a finite number > 0 (1: none), got {self.repetition_penalty}"
            )
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidArgument("min_p", f"must be in [0, 1] (0: none), got {self.min_p}")
        for token, bias in self.logit_bias:
            if token < 0:
                raise InvalidArgument("logit_bias", f"token ids must be >= 0, got {token}")
            if not -100.0 <= bias <= 100.0:
                raise InvalidArgument(
                    "logit_bias", f"biases must be in [-100, 100], got {bias} for token {token}"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def choice(self, index: int) -> SamplingParams:
        """The params of choice `index` of n: one choice, its own seed (seed + index) when seeded."""
        seed = None if self.seed is None else (self.seed + index) % 2**64
        return replace(self, n=1, seed=seed)

    @property
    def penalized(self) -> bool:
        """Whether a penalty needs the tokens seen so far (the sampler then keeps their counts)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def adjusts_logits(self) -> bool:
        """Whether any logit control is on: a batch where no row sets one skips them all."""
        return self.penalized or bool(self.logit_bias) or self.min_p > 0.0
