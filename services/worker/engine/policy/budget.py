"""The per-step token budget, chosen from measured step times.

StepTimeModel keeps an exponentially weighted mean of the measured step time per batch shape
(tokens rounded up to a power of two, sequences rounded up to a power of two). BudgetController picks,
each step, the largest budget (in steps of its minimum) whose predicted step time meets the tightest
latency target in play (for an inter-token target, no smaller than keeps a given share of the best
predicted tokens/second), or, with only throughput work present, grows toward the budget with the best
measured tokens/second.
"""

from __future__ import annotations

_EWMA = 0.2  # weight of a new sample: a few steps to follow a change, robust to one noisy step
_NEAR_BEST = 0.95  # a budget within 5% of the best tokens/s is as good, and keeps steps shorter
_INFEASIBLE_SLACK = 1.2  # see BudgetController._fit_unreachable


def _bucket(n: int) -> int:
    """n rounded up to a power of two (n >= 1)."""
    return 1 << max(0, n - 1).bit_length()


class StepTimeModel:
    """Measured step seconds per (token bucket, sequence bucket), and the mean token count of the steps
    in each bucket, so estimates interpolate between the sizes actually run rather than bucket edges."""

    def __init__(self) -> None:
        self._points: dict[tuple[int, int], tuple[float, float]] = {}  # -> (mean tokens, mean seconds)
        # Per sequence bucket, its points sorted by tokens: the controller estimates a dozen sizes a step
        # and the model changes once a step, so sort once per change rather than per estimate.
        self._sorted: dict[int, list[tuple[float, float]]] = {}
        self._seq_buckets: set[int] = set()

    def observe(self, num_tokens: int, num_seqs: int, seconds: float) -> None:
        """Record one step that computed num_tokens >= 1 tokens for num_seqs >= 1 sequences."""
        key = (_bucket(num_tokens), _bucket(num_seqs))
        self._sorted.pop(key[1], None)
        self._seq_buckets.add(key[1])
        old = self._points.get(key)
        if old is None:
            self._points[key] = (float(num_tokens), seconds)
        else:
            tokens, mean = old
            self._points[key] = (tokens + _EWMA * (num_tokens - tokens), mean + _EWMA * (seconds - mean))

    def estimate(self, num_tokens: int, num_seqs: int, realistic: bool = False) -> float | None:
        """Predicted seconds for a step of that shape; None before the first observed step.

        Between two measured sizes it interpolates linearly; past the largest it scales that one's time
        by the token ratio, which overestimates (a step has fixed costs): the safe side for an SLO; below
        the smallest it takes the smallest's time, again an overestimate. With nothing measured at this
        many sequences it borrows the nearest larger count (slower, so again the safe side), else the
        nearest smaller one.

        realistic: outside the measured sizes, the best guess rather than the safe side (for throughput,
        where overestimating is no safer): past the largest, the line through the two largest (their
        difference is what a token costs; the rest is the step's fixed cost); below the smallest, the
        line through the two smallest, never under that step's time scaled down by the token ratio
        (no fixed cost at all), which is also the guess while only one size is measured. Without it a
        budget smaller than any step run so far looked as slow as the smallest one, so a bound on
        tokens/s kept the budget at the large sizes forever and never measured a small step (on
        SmolLM2: 2 s prefill steps with chat streams waiting through them).
        """
        if not self._points:
            return None
        points = self._points_near(_bucket(num_seqs))
        below = [(t, s) for t, s in points if t <= num_tokens]
        above = [(t, s) for t, s in points if t >= num_tokens]
        if below and above:
            (t0, s0), (t1, s1) = below[-1], above[0]
            return s0 if t1 == t0 else s0 + (s1 - s0) * (num_tokens - t0) / (t1 - t0)
        if below:
            t0, s0 = below[-1]
            if realistic and len(below) > 1:
                t1, s1 = below[-2]
                per_token = (s0 - s1) / (t0 - t1) if t0 > t1 else 0.0
                if per_token > 0:
                    return s0 + per_token * (num_tokens - t0)
            return s0 * num_tokens / t0
        t0, s0 = above[0]
        if not realistic:
            return s0
        proportional = s0 * num_tokens / t0
        if len(above) > 1:
            t1, s1 = above[1]
            per_token = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
            if per_token > 0:
                return max(proportional, s0 - per_token * (t0 - num_tokens))
        return proportional

    def _points_near(self, wanted: int) -> list[tuple[float, float]]:
        """The measured (tokens, seconds) points, by tokens, of the smallest sequence bucket >= wanted,
        else of the largest one."""
        larger = [q for q in self._seq_buckets if q >= wanted]
        seq_bucket = min(larger) if larger else max(self._seq_buckets)
        points = self._sorted.get(seq_bucket)
        if points is None:
            points = sorted(point for (_, q), point in self._points.items() if q == seq_bucket)
            self._sorted[seq_bucket] = points
        return points

    def throughput(self, num_tokens: int, num_seqs: int) -> float | None:
        """Measured tokens/second of steps in that shape's bucket; None if never measured."""
        point = self._points.get((_bucket(num_tokens), _bucket(num_seqs)))
        return None if point is None or not point[1] else point[0] / point[1]


class BudgetController:
    """Chooses each step's token budget in [minimum, maximum], powers of two in between."""

    def __init__(self, minimum: int, maximum: int, model: StepTimeModel | None = None) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum} and {maximum}")
        self.minimum = minimum
        self.maximum = maximum
        self.model = model or StepTimeModel()
        self.current = maximum
        candidates = {maximum}
        size = _bucket(minimum)
        while size < maximum:
            candidates.add(max(size, minimum))
            size *= 2
        self.candidates = sorted(candidates)

    def choose(
        self,
        target_s: float | None,
        num_seqs: int,
        floor: int = 0,
        alone: int = 0,
        min_efficiency: float = 0.0,
    ) -> int:
        """This step's budget.

        target_s: the longest step the latency work in play can afford (None: no latency work).
        num_seqs: sequences that could be in the step. floor: tokens the most urgent latency work needs
        now; the budget never cuts those, it cuts the throughput work scheduled after them. alone: when
        even the smallest step would miss the target, run just this many tokens (the latency work
        alone, below the minimum if need be: the fastest it can go); 0 to keep throughput instead.
        min_efficiency: the target may shrink the step only as far as its predicted tokens/s stays at
        least this share of the best budget's (0: as far as the target asks).
        """
        seqs = max(1, num_seqs)
        if target_s is None:
            self.current = self._grow(seqs)
        else:
            fit = self._fit(target_s, seqs)
            if fit is None and alone:
                return min(self.maximum, alone)
            self.current = self._fit_unreachable(seqs) if fit is None else fit
            if min_efficiency > 0:
                self.current = max(self.current, self._efficient(seqs, min_efficiency))
        return min(self.maximum, max(self.current, floor, self.minimum))

    def _estimate(self, budget: int, seqs: int) -> float | None:
        # A step of b tokens holds at most b sequences: mostly decodes, and each costs its own context.
        return self.model.estimate(budget, min(budget, seqs))

    def _fit(self, target_s: float, seqs: int) -> int | None:
        """The largest budget, a multiple of the minimum (or the maximum), predicted to finish within
        target_s; None when not even the minimum is; the current budget while nothing is measured yet
        (keep it and measure). Powers of two alone would leave up to half the target unused: on a CPU,
        where a step's time grows with every token, that is half the throughput work a step could do."""
        if self._estimate(self.minimum, seqs) is None:
            return self.current

        def fits(budget: int) -> bool:
            return self._estimate(budget, seqs) <= target_s  # type: ignore[operator]  # measured: a float

        if not fits(self.minimum):
            return None
        if fits(self.maximum):
            return self.maximum
        # Estimates grow with the budget: bisect on multiples of the minimum, low fits, high does not.
        low, high = 1, self.maximum // self.minimum + 1
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle * self.minimum) else (low, middle)
        return min(low * self.minimum, self.maximum)

    def _fit_unreachable(self, seqs: int) -> int:
        """With no latency work in the step and a target out of reach, shrinking further buys almost no
        latency (a step's fixed cost dominates) and costs most of the throughput: the largest budget
        within _INFEASIBLE_SLACK of the smallest step's time. That time is the realistic estimate: until
        a small step has run, the safe one says it takes as long as the smallest run so far, and the
        budget would never come down to measure it."""
        smallest = self.candidates[0]
        shortest = self.model.estimate(smallest, min(smallest, seqs), realistic=True)
        if shortest is None:
            return self.current
        return self._fit(shortest * _INFEASIBLE_SLACK, seqs) or self.minimum

    def _rate(self, budget: int, seqs: int) -> float | None:
        """Predicted tokens/s of a step of budget tokens; outside the sizes measured, the realistic
        estimate (so a budget larger, or smaller, than any run yet can be found better)."""
        seconds = self.model.estimate(budget, min(budget, seqs), realistic=True)
        return None if not seconds else budget / seconds

    def _efficient(self, seqs: int, share: float) -> int:
        """The smallest budget, a multiple of the minimum, predicted to run at least share of the best
        candidate's tokens/s (0 before anything is measured: no bound yet)."""
        rates = [(b, r) for b in self.candidates if (r := self._rate(b, seqs)) is not None]
        if not rates:
            return 0
        best_budget, best = max(rates, key=lambda item: item[1])
        wanted = share * best

        def efficient(budget: int) -> bool:
            return (self._rate(budget, seqs) or 0.0) >= wanted

        if efficient(self.minimum):
            return self.minimum
        # Tokens/s grows with the budget up to the best one: bisect below it, low too slow, high enough.
        low, high = 1, max(1, best_budget // self.minimum)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if efficient(middle * self.minimum) else (middle, high)
        return high * self.minimum if efficient(high * self.minimum) else best_budget

    def _grow(self, seqs: int) -> int:
        """Double toward the throughput-optimal budget: the smallest measured one within 5% of the best
        measured tokens/s, or the maximum while the best is the largest measured (bigger may be better)."""
        measured = [(b, r) for b in self.candidates if (r := self.model.throughput(b, seqs)) is not None]
        if not measured:
            optimum = self.maximum
        else:
            best = max(r for _, r in measured)
            largest, largest_rate = measured[-1]
            if largest < self.maximum and largest_rate >= _NEAR_BEST * best:
                optimum = self.maximum
            else:
                optimum = next(b for b, r in measured if r >= _NEAR_BEST * best)
        if self.current >= optimum:
            return optimum
        return min(optimum, self.current * 2)
