"""Token sampling for one step: logit bias and penalties (logit_controls.py), structured output's
grammar masks (grammar.py), greedy, temperature, min-p, top-k, top-p, per-request seeds."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from services.common.sampling import SamplingParams
from services.worker.engine.grammar import GrammarMasks
from services.worker.engine.logit_controls import LogitControls
from services.worker.engine.sequence import Sequence


class Sampler:
    """Picks one token per row of logits. Seeded requests draw from their own generator, so the same
    seed gives the same output whatever else shares the batch; the rest share the engine's generator."""

    def __init__(self, device: torch.device, seed: int | None = None) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self._request_generators: dict[str, torch.Generator] = {}
        self.controls = LogitControls(device)
        self.masks = GrammarMasks()

    def release(self, request_id: str) -> None:
        """Forget a finished request's generator and penalty state."""
        self._request_generators.pop(request_id, None)
        self.controls.release(request_id)

    def sample(self, logits: torch.Tensor, seqs: Seq[Sequence]) -> list[int]:
        """One token id per row of logits [N, V] (float32), row i being seqs[i]; logits may be changed."""
        params = [seq.params for seq in seqs]
        penalised = None
        if any(p.adjusts_logits for p in params):  # otherwise nothing below costs a tensor operation
            penalised = self.controls.apply(logits, seqs)
        matchers = [(i, seq.matcher) for i, seq in enumerate(seqs) if seq.matcher is not None]
        if matchers:
            self.masks.apply(logits, matchers)
        tokens = self._sample(logits, [seq.request_id for seq in seqs], params)
        if penalised is not None:
            rows, slots = penalised
            self.controls.record(slots, tokens[rows])
        chosen = tokens.tolist()
        if matchers:
            self.masks.accept(matchers, chosen)
        return chosen

    def _sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        # max().indices, not argmax(): same first-maximum rule, measured ~3x faster on CPU.
        greedy_tokens = logits.max(dim=-1).indices
        if all(p.greedy for p in params):
            return greedy_tokens
        temperatures = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
        logits = logits / temperatures.unsqueeze(1)
        if any(p.min_p > 0.0 for p in params):
            logits = _min_p(logits, params)
        if any(p.top_k is not None or p.top_p < 1.0 for p in params):
            probs, token_ids = self._truncated_probs(logits, params)
        else:
            probs, token_ids = logits.softmax(dim=-1), None
        choice = (probs / self._exponential_noise(probs, request_ids, params)).max(dim=-1).indices
        sampled = choice if token_ids is None else token_ids.gather(1, choice.unsqueeze(1)).squeeze(1)
        is_greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        return torch.where(is_greedy, greedy_tokens, sampled)

    def _truncated_probs(
        self, logits: torch.Tensor, params: list[SamplingParams]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Probabilities over the vocabulary sorted descending, with top-k / top-p tails zeroed."""
        sorted_logits, token_ids = logits.sort(dim=-1, descending=True)
        vocab = logits.shape[-1]
        top_k = torch.tensor([min(p.top_k or vocab, vocab) for p in params], device=logits.device)
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        top_p = torch.tensor([p.top_p for p in params], device=logits.device).unsqueeze(1)
        # Keep the smallest prefix whose mass reaches top_p: a token goes when the mass before it is enough.
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(mass_before >= top_p, 0.0)
        return probs, token_ids

    def _exponential_noise(
        self, probs: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """Exp(1) noise per row; argmax(p / noise) is a sample from p (the exponential race)."""
        noise = torch.empty_like(probs)
        noise.exponential_(generator=self.generator)
        for row, (request_id, p) in enumerate(zip(request_ids, params, strict=True)):
            if p.seed is None or p.greedy:
                continue
            generator = self._request_generators.get(request_id)
            if generator is None:
                generator = torch.Generator(device=probs.device).manual_seed(p.seed)
                self._request_generators[request_id] = generator
            noise[row].exponential_(generator=generator)
        return noise


def _min_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Logits with -inf for each token less likely than min_p x its row's likeliest (the likeliest always
    stays); rows with min_p 0 unchanged."""
    min_p = torch.tensor([p.min_p for p in params], device=logits.device).unsqueeze(1)
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
