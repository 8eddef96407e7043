"""Per-request sampling parameters, validated at construction: the engine samples with them, and the
gateway builds them from a request (sampling_proto.py) to refuse bad values before placing it, so both
apply the same rules. No protobuf here: the engine runs without the generated code."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import InvalidArgument


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

    def __post_init__(self) -> None:
        # Lists are accepted for convenience and frozen into tuples so params can be shared safely.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
