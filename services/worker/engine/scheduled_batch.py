"""One step's work as the scheduler hands it to the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.worker.engine.errors import AdmissionError
from services.worker.engine.sequence import Sequence


@dataclass
class ScheduledBatch:
    """One step's work: seqs[i] computes num_tokens[i] tokens starting at its num_computed_tokens.

    will_sample[i] is True when that chunk reaches the end of seqs[i]'s tokens, i.e. the model must
    sample a token for it; fixed when the batch is built, so it stays valid while update() runs.
    """

    seqs: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    will_sample: list[bool] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # preempted while building this batch
    # Never-scheduled requests that waited past their class's queue timeout, with the error to send.
    rejected: list[tuple[Sequence, AdmissionError]] = field(default_factory=list)
    total_tokens: int = 0
    budget: int = 0  # the token budget the policy chose for this step

    def add(self, seq: Sequence, n: int) -> None:
        """Append seq computing n >= 1 tokens this step."""
        self.seqs.append(seq)
        self.num_tokens.append(n)
        self.will_sample.append(seq.num_computed_tokens + n == seq.num_tokens)
        self.total_tokens += n
