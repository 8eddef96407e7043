"""The worker's adaptive step budget as the engine model predicts it (GpuProfile.itl_min_efficiency):
how many prompt tokens the next prompt step carries beside the running decodes. StepBudget reads the
engine's state, declared by the classes it extends, so that it compiles with sim/compiled.py."""

from __future__ import annotations

from sim.admission import Admission
from sim.profiles import ModelCost

BUDGET_STEP = 16  # the adaptive budget's granularity (the worker policy's min_batched_tokens)


def prompt_budget(
    full: int,
    decodes: int,
    fixed_s: float,
    cost: ModelCost,
    share: float,
    latency_in_play: bool,
    top_latency_tokens: int,
) -> int:
    """Of at most full prompt tokens, those giving the best predicted tokens/s for a first chunk (no
    context before it) beside `decodes` decodes whose step costs fixed_s; while latency work is in play,
    the fewest keeping `share` of that best, but never fewer than the top latency level's own tokens."""
    if full <= BUDGET_STEP:
        return full
    sizes = [*range(BUDGET_STEP, full, BUDGET_STEP), full]
    rates = [(b + decodes) / (fixed_s + cost.prompt_s(0, b)) for b in sizes]
    best = max(rates)
    if not latency_in_play:
        return sizes[rates.index(best)]
    chosen = next(b for b, rate in zip(sizes, rates, strict=True) if rate >= share * best)
    return min(full, max(chosen, top_latency_tokens))


class StepBudget(Admission):
    """GpuEngine's prompt budget per step (sim/engine_model.py)."""

    def _decode_step_s(self) -> float:
        """One decode step of the running sequences at full clock: each active model's fixed cost, its
        rows' and their context's."""
        step_s = 0.0
        for model, rows in self.rows.items():
            if rows:
                cost = self.costs[model]
                step_s += cost.base_s + cost.per_row_s * rows + cost.per_context_token_s * self.context[model]
        return step_s

    def _budget(self, decodes: int) -> int:
        """Prompt tokens the next step may carry: the whole budget left after one token per decode, or
        with the profile's itl_min_efficiency the adaptive policy's choice (prompt_budget)."""
        full = self.profile.token_budget - decodes
        share = self.profile.itl_min_efficiency
        if share is None or full <= BUDGET_STEP:
            return full
        fixed = self._decode_step_s()
        latency = [r for r in self.prefilling if r.priority < 2] + [*self.waiting[0], *self.waiting[1]]
        in_play = bool(latency) or any(r.priority < 2 for _, _, r in self.running)
        top = min((r.priority for r in latency), default=None)
        own = sum(
            r.to_prefill if r in self.prefilling else r.prompt + r.generated
            for r in latency
            if r.priority == top
        )
        decoder = self._decoder_cost
        assert decoder is not None  # a GPU with a prompt to run holds a decoder
        return prompt_budget(full, decodes, fixed or decoder.base_s, decoder, share, in_play, own)
