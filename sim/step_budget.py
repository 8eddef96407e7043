"""The worker's adaptive step budget as the engine model predicts it (GpuProfile.itl_min_efficiency):
how many prompt tokens the next prompt step carries beside the running decodes."""

from __future__ import annotations

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
    per_token_s = cost.per_prefill_token_s
    sizes = [*range(BUDGET_STEP, full, BUDGET_STEP), full]
    rates = [(b + decodes) / (fixed_s + b * (per_token_s + cost.per_prefill_attention_s * b)) for b in sizes]
    best = max(rates)
    if not latency_in_play:
        return sizes[rates.index(best)]
    chosen = next(b for b, rate in zip(sizes, rates, strict=True) if rate >= share * best)
    return min(full, max(chosen, top_latency_tokens))
