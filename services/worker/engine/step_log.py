"""A record of every engine step as it ran while serving: its shape and how long it took, one JSON line each.

The fleet simulator's step-time model is fitted to such records (sim/serving_fit.py). Timing a step alone
in a process of its own (sim/calibrate.py) measures the model; a serving worker's steps also share the
cores and the GIL with its gRPC server, the token streams it feeds and the other services of the machine,
and on the CPU mesh that makes them about twice as slow. So the record is written where the steps run, and
only when asked for (HANZO_WORKER_STEP_LOG_DIR): a JSON line per step costs the engine thread a few
microseconds (a line-buffered write).

A line: {"batches": batches run, "rows": decode rows, "context": tokens those rows attend to, "prefill":
prompt tokens computed, "attention": the (query, key) pairs its prompt chunks attend
(attention_work.attended_pairs), "seconds": wall time of the whole iteration (the batches, handing
their outputs to the event loop and taking the next commands: what paces the tokens a caller sees),
"execute_s": the model's share of it, "end": the wall clock (Unix seconds) when it ended, "chunks":
[request id, first position, tokens] of each prompt chunk it computed, "added": [request id, Unix
seconds] of each request the engine took since the line before, "running" and "waiting": the engine's
sequences holding seats and queued as it began}. The last four line a step up with the requests a
caller timed: when a request reached the engine, what it waited behind there, and when its own chunks
ran (bench/fidelity_waits.py).
An encoder's line has rows 0, prefill its input tokens, inputs the texts, chunks none.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from services.worker.engine.attention_work import attended_pairs
from services.worker.engine.scheduled_batch import ScheduledBatch


@dataclass
class StepShape:
    """What a step computed, summed over its batches (the fields of a step-log line but the times), and
    the engine's queues as it began."""

    batches: int = 0
    rows: int = 0
    context: int = 0
    prefill: int = 0
    attention: int = 0
    execute_s: float = 0.0
    running: int = 0  # sequences holding seats and KV when the step began
    waiting: int = 0  # sequences queued for admission then
    chunks: list[tuple[str, int, int]] = field(default_factory=list)  # (request id, start, tokens)
    added: list[tuple[str, float]] = field(default_factory=list)  # (request id, Unix s) taken meanwhile

    def add(self, batch: ScheduledBatch, execute_s: float) -> None:
        """Count batch, as scheduled (before its sequences advance), which ran in execute_s."""
        self.batches += 1
        self.execute_s += execute_s
        for seq, n in zip(batch.seqs, batch.num_tokens, strict=True):
            start = seq.num_computed_tokens
            if start >= seq.num_prompt_tokens:
                self.rows += 1
                self.context += start + n
            else:
                self.prefill += n
                self.attention += attended_pairs(start, n)
                self.chunks.append((seq.request_id, start, n))


class StepLog:
    """Appends JSON lines to path (created with its directory); safe to share between threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Line-buffered: a worker stopped by a signal keeps every step it wrote.
        self._file: IO[str] | None = path.open("a", buffering=1)
        self._lock = threading.Lock()

    def write(self, record: dict[str, object]) -> None:
        """Append record as a line, stamped with the wall clock now ("end") unless it carries one."""
        record.setdefault("end", time.time())
        with self._lock:
            if self._file is not None:
                self._file.write(json.dumps(record) + "\n")

    def write_step(self, shape: StepShape, seconds: float) -> None:
        """One iteration of an engine thread: shape's batches and the iteration's wall time."""
        self.write(
            {
                "batches": shape.batches,
                "rows": shape.rows,
                "context": shape.context,
                "prefill": shape.prefill,
                "attention": shape.attention,
                "seconds": seconds,
                "execute_s": shape.execute_s,
                "chunks": shape.chunks,
                "added": shape.added,
                "running": shape.running,
                "waiting": shape.waiting,
            }
        )

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def step_log_for(directory: str | None, model_name: str, process: str) -> StepLog | None:
    """The step log of model_name in this worker process under directory; None when not asked for."""
    if not directory:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)
    return StepLog(Path(directory) / f"{process}-{safe}.jsonl")
