"""Log probabilities of the sampled tokens, for the rows of a step that ask for them.

They are the model's own: a log-softmax of the raw logits taken before logit bias, penalties, the
min_tokens ban, grammar masks and temperature change them (vLLM's default "raw_logprobs" mode), so
they say what the model thought of the token, not how likely the sampler was to pick it. One
log-softmax and one top-k over the asking rows, batched; a step where no row asks costs one scan of
the rows' params.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from services.worker.engine.sequence import Sequence, TokenLogprob


class StepLogprobs:
    """The raw log-softmax of the asking rows of one step, read before the logits are changed; record()
    then hands each of those sequences its sampled token's TokenLogprob (Sequence.logprob)."""

    def __init__(self, rows: list[int], seqs: list[Sequence], logprobs: torch.Tensor) -> None:
        self._rows = rows
        self._seqs = seqs
        self._logprobs = logprobs  # [R, V]

    @classmethod
    def capture(cls, logits: torch.Tensor, seqs: Seq[Sequence]) -> StepLogprobs | None:
        """None when no row of logits [N, V] asks for logprobs (row i being seqs[i])."""
        rows = [i for i, seq in enumerate(seqs) if seq.params.logprobs is not None]
        if not rows:
            return None
        index = torch.tensor(rows, device=logits.device)
        # index_select copies, so the samplers' in-place changes to logits do not reach these.
        logprobs = logits.index_select(0, index).float().log_softmax(dim=-1)
        return cls(rows, [seqs[i] for i in rows], logprobs)

    def record(self, tokens: list[int]) -> None:
        """Set Sequence.logprob of each asking row from the step's sampled tokens (one per row of logits)."""
        logprobs = self._logprobs
        chosen = torch.tensor([tokens[i] for i in self._rows], device=logprobs.device).unsqueeze(1)
        chosen_logprob = logprobs.gather(1, chosen)
        # vLLM's rank: how many tokens are likelier, plus one (ties with the chosen one do not count).
        ranks = (logprobs > chosen_logprob).sum(dim=-1) + 1
        most = max(seq.params.logprobs or 0 for seq in self._seqs)
        top_values: list[list[float]] = [[] for _ in self._rows]
        top_ids: list[list[int]] = [[] for _ in self._rows]
        if most:
            values, ids = logprobs.topk(most, dim=-1)
            top_values, top_ids = values.tolist(), ids.tolist()
        for seq, token, value, rank, ids_row, values_row in zip(
            self._seqs, chosen[:, 0].tolist(), chosen_logprob[:, 0].tolist(), ranks.tolist(),
            top_ids, top_values, strict=True,
        ):  # fmt: skip
            k = seq.params.logprobs or 0
            seq.logprob = TokenLogprob(
                token, value, rank, tuple(zip(ids_row[:k], values_row[:k], strict=True))
            )
