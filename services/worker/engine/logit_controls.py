"""Logit bias and the repetition, frequency and presence penalties, applied to one step's logits as
batched tensor operations over the rows that ask for them (vLLM's order: bias, then penalties, both
before temperature; SamplingParams documents each rule).

A penalty needs the tokens a sequence has seen. Rebuilding that from token lists every step costs a
pass over every context; instead each penalised request owns a row of two tables kept across steps:
how often each token is in its output, and whether it is in its prompt. A row is filled once, when the
request is first sampled (after a preemption its tokens are the same, so the row stays right), and
gets one scatter-add per step; rows are reused as requests finish.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from services.worker.engine.sequence import Sequence


class LogitControls:
    """Per-request penalty state on one device, and the step's bias and penalty passes."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._slots: dict[str, int] = {}  # request id -> row of the tables
        self._free: list[int] = []
        self._output_counts = torch.zeros((0, 0), dtype=torch.int32, device=device)  # [rows, vocab]
        self._in_prompt = torch.zeros((0, 0), dtype=torch.bool, device=device)  # [rows, vocab]
        self._bias: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # request id -> (token ids, biases)

    def release(self, request_id: str) -> None:
        """Forget a finished request: its table row goes back to the free list."""
        slot = self._slots.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)
        self._bias.pop(request_id, None)

    def apply(self, logits: torch.Tensor, seqs: Seq[Sequence]) -> tuple[list[int], torch.Tensor] | None:
        """Bias and penalise logits [N, V] in place, row i being seqs[i]. Returns the penalised rows and
        their table slots (for record()), or None when no row is penalised."""
        biased = [i for i, seq in enumerate(seqs) if seq.params.logit_bias]
        if biased:
            self._add_bias(logits, seqs, biased)
        penalised = [i for i, seq in enumerate(seqs) if seq.params.penalized]
        if not penalised:
            return None
        slots = torch.tensor([self._slot(seqs[i], logits.shape[1]) for i in penalised], device=self.device)
        rows = torch.tensor(penalised, device=self.device)
        params = [seqs[i].params for i in penalised]
        counts = self._output_counts.index_select(0, slots)
        in_output = counts > 0
        seen = self._in_prompt.index_select(0, slots) | in_output
        sub = logits.index_select(0, rows)
        repetition = self._column([p.repetition_penalty for p in params])
        sub = torch.where(seen, torch.where(sub > 0, sub / repetition, sub * repetition), sub)
        sub -= self._column([p.frequency_penalty for p in params]) * counts
        sub -= self._column([p.presence_penalty for p in params]) * in_output
        logits.index_copy_(0, rows, sub)
        return penalised, slots

    def record(self, slots: torch.Tensor | None, tokens: torch.Tensor) -> None:
        """Count each penalised row's sampled token (tokens: [R], the rows apply() returned slots for)."""
        if slots is None:
            return
        ones = torch.ones_like(tokens, dtype=torch.int32)
        self._output_counts.index_put_((slots, tokens), ones, accumulate=True)

    def _column(self, values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=self.device).unsqueeze(1)

    def _add_bias(self, logits: torch.Tensor, seqs: Seq[Sequence], rows: list[int]) -> None:
        row_ids, token_ids, biases = [], [], []
        for i in rows:
            ids, values = self._bias_of(seqs[i])
            row_ids.append(torch.full_like(ids, i))
            token_ids.append(ids)
            biases.append(values)
        logits.index_put_((torch.cat(row_ids), torch.cat(token_ids)), torch.cat(biases), accumulate=True)

    def _bias_of(self, seq: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self._bias.get(seq.request_id)
        if cached is None:
            pairs = seq.params.logit_bias
            ids = torch.tensor([t for t, _ in pairs], dtype=torch.long, device=self.device)
            values = torch.tensor([b for _, b in pairs], dtype=torch.float32, device=self.device)
            cached = self._bias[seq.request_id] = (ids, values)
        return cached

    def _slot(self, seq: Sequence, vocab: int) -> int:
        """seq's table row, filled from its tokens the first time."""
        slot = self._slots.get(seq.request_id)
        if slot is not None:
            return slot
        if self._output_counts.shape[1] != vocab:  # first use: the tables take the logits' width
            self._output_counts = torch.zeros((0, vocab), dtype=torch.int32, device=self.device)
            self._in_prompt = torch.zeros((0, vocab), dtype=torch.bool, device=self.device)
        if not self._free:
            self._grow()
        slot = self._slots[seq.request_id] = self._free.pop()
        prompt = torch.tensor(seq.token_ids[: seq.num_prompt_tokens], dtype=torch.long, device=self.device)
        output = torch.tensor(seq.output_token_ids, dtype=torch.long, device=self.device)
        self._in_prompt[slot] = False
        self._in_prompt[slot, prompt] = True
        self._output_counts[slot] = torch.bincount(output, minlength=vocab).to(torch.int32)
        return slot

    def _grow(self) -> None:
        """Double the tables (at least 8 rows), so a step never waits on more than one copy."""
        old = self._output_counts.shape[0]
        rows = max(8, 2 * old)
        vocab = self._output_counts.shape[1]
        counts = torch.zeros((rows, vocab), dtype=torch.int32, device=self.device)
        in_prompt = torch.zeros((rows, vocab), dtype=torch.bool, device=self.device)
        counts[:old] = self._output_counts
        in_prompt[:old] = self._in_prompt
        self._output_counts, self._in_prompt = counts, in_prompt
        self._free.extend(range(rows - 1, old - 1, -1))
