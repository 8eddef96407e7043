"""An encoder request's path through one GPU's engine model (sim/engine_model.py's GpuEngine, which
extends EncoderPath). EncoderPath reads the engine's state, declared here as the classes it extends
declare theirs, so that it compiles with sim/compiled.py."""

from __future__ import annotations

from sim.request import Request
from sim.step_budget import StepBudget

IDLE, DECODE, STEP = 0, 1, 2  # the engine's mode: nothing running, a decode stretch, a prompt step


class EncoderPath(StepBudget):
    """GpuEngine's encoder requests: the encoder is an engine of its own on the GPU, with no KV and no
    queue behind the decoder's prompts."""

    mode: int
    clock: float
    t: float
    step_end: float
    busy_prefill_s: float
    prefill_compute_s: float

    def _embed(self, request: Request, now: float) -> None:
        """Run request at once, after the profile's encoder wait if the GPU is busy, at the profile's
        share of the compute while the decoder works (encoder_core_share); whatever the decoder was doing
        finishes its encode's worth later."""
        cost = self.costs[request.model]
        prompt_s = request.prompt * cost.per_prefill_token_s
        seconds = (cost.base_s + prompt_s) / self.clock
        self.prefill_compute_s += prompt_s
        profile = self.profile
        if self.mode == IDLE:
            request.first_token_s = now + seconds
        else:
            request.first_token_s = now + profile.encoder_wait + seconds / profile.encoder_core_share
        if self.mode == STEP:
            self.step_end += seconds
            self._at(self.step_end, force=True)
        elif self.mode == DECODE:
            self.busy_prefill_s += seconds
            self.t = now + seconds  # decodes resume after it (advance() skips the gap)
            self._plan_decode(now + seconds)
        else:
            self.busy_prefill_s += seconds
        self._finish(request, request.first_token_s)

    # GpuEngine's own, declared here for _embed (a base class cannot name its subclass's methods).

    def _at(self, when: float, force: bool = False) -> None:
        raise NotImplementedError

    def _plan_decode(self, now: float) -> None:
        raise NotImplementedError

    def _finish(self, request: Request, now: float) -> None:
        raise NotImplementedError
