"""What one simulated run measured, per workload class and for the fleet, and its service levels."""

from __future__ import annotations

import numpy as np

from sim.config import ServiceLevel
from sim.request import Request


class ClassResults:
    def __init__(self, slo: ServiceLevel) -> None:
        self.slo = slo
        self.ttft: list[float] = []
        self.e2e: list[float] = []
        self.met = 0
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.cross_zone = 0
        self.rejected = 0

    def record(self, request: Request, network_s: float) -> None:
        ttft = request.first_token_s - request.arrival_s + network_s
        e2e = request.done_s - request.arrival_s + network_s
        self.ttft.append(ttft)
        self.e2e.append(e2e)
        self.output_tokens += request.output
        self.prompt_tokens += request.prompt
        slo = self.slo
        ok = True
        if slo.ttft_s is not None:
            ok = ttft <= slo.ttft_s
            if ok and slo.tpot_s is not None and request.output > 1:
                ok = (e2e - ttft) / (request.output - 1) <= slo.tpot_s
        if slo.e2e_s is not None:
            ok = ok and e2e <= slo.e2e_s
        self.met += bool(ok)

    def summary(self, duration_s: float, unfinished: int) -> dict[str, float | int | None]:
        done = len(self.ttft)
        judged = done + self.rejected + unfinished
        ttft = np.asarray(self.ttft)
        return {
            "requests": judged,
            "completed": done,
            "slo_attainment": self.met / judged if judged else None,
            "ttft_p50_s": _percentile(ttft, 50),
            "ttft_p99_s": _percentile(ttft, 99),
            "e2e_p50_s": _percentile(np.asarray(self.e2e), 50),
            "e2e_p99_s": _percentile(np.asarray(self.e2e), 99),
            "output_tok_s": self.output_tokens / duration_s,
            "prompt_tok_s": self.prompt_tokens / duration_s,
            "cross_zone": self.cross_zone,
            "rejected": self.rejected,
            "unfinished": unfinished,
        }


def _percentile(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None
