"""What the slowest requests of a bench/sim_fidelity.py run waited for on the real mesh, from the workers'
step logs (each step's wall-clock end, the prompt chunks it computed, the requests the engine took and
its queues, step_log.py) lined up with the requests as the client timed them, beside the simulator's
figures for the same request. One JSON line per request, slowest first, then a summary line.

    .venv/bin/python bench/fidelity_waits.py [--workload realtime_chat] [--top 10] [--result PATH]

For a request sent at `arrival` whose first token came `ttft` later:
- to_engine_s: from arrival until an engine first took it (the gateway, the placer, the RPC and the
  engine thread's next look at its commands); moved_from: the workers that took it before the one that
  served it (one refuses a request its class's queue timeout expired on, and the gateway sends it to
  another), and to_this_engine_s when the serving one took it;
- queued_s: from the serving engine's take to the start of the step that ran its first prompt chunk
  (0 when that chunk was nested in a step already running, as the worker runs an urgent prompt), and
  how its worker spent the time: steps computing other requests' prompts (by class), steps of decodes
  only, no step (idle_s); seats_full_steps: how many of those steps began with every seat taken;
- own_steps_s: the steps that ran its chunks, with what the run's serving fit predicts for them (more
  than predicted: the step shared the cores) and the other prompts' tokens computed beside it;
- tail_s: from its last chunk's step to the first token at the client;
- other_worker_busy: the share of the request's wait during which the other worker was stepping (two
  workers share this machine's two cores with the gateway, placer and client).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fidelity_records import requests_path
from bench.fidelity_steps import steps_dir
from sim.cli_args import positive
from sim.fidelity import CHAT_MODEL
from sim.fit import TERMS
from sim.serving_fit import logs_by_model

RESULT = Path(__file__).resolve().parents[1] / ".cache" / "bench" / "sim_fidelity.json"
MEDIANS = (
    "ttft_s", "to_engine_s", "to_this_engine_s", "queued_s", "idle_s", "own_steps_s", "own_steps_predicted_s",
    "tail_s", "other_worker_busy",
)  # fmt: skip
CLOCK_SLACK_S = 0.05  # the client's time 0 is read a moment after the wall clock it is lined up by
DECODING = ("realtime_chat", "agent_tool", "batch")  # the classes whose prompts the decoder's steps log
ID_PREFIX = "fidelity"  # bench/fidelity_replay.py names request (session, turn) "fidelity-<session>-<turn>"


@dataclass(frozen=True)
class Step:
    """One logged engine iteration of a worker: its wall-clock span and shape."""

    worker: str
    start: float
    end: float
    features: tuple[float, float, float, float, float]  # as sim/fit.py's StepSample.features
    chunks: tuple[tuple[str, int, int], ...]
    added: dict[str, float]  # request id -> when the engine took it (since the step before)
    running: int  # sequences holding seats as it began

    @property
    def seconds(self) -> float:
        return self.end - self.start


def read_steps(directory: Path, model: str) -> list[Step]:
    """Every step of model's workers under directory, in order of their start. ValueError for a log
    written before the lines carried their wall-clock end."""
    steps = []
    for path in logs_by_model(directory).get(model, []):
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # cut short by a stopping worker
            if "end" not in r:
                raise ValueError(f"{path} has no wall-clock times: a run from before step logs carried them")
            features = (r["batches"], r["rows"], r["context"], r["prefill"], r["attention"])
            chunks = tuple((str(c[0]), int(c[1]), int(c[2])) for c in r.get("chunks", ()))
            added = {str(a[0]): float(a[1]) for a in r.get("added", ())}
            start = r["end"] - r["seconds"]
            steps.append(Step(path.stem, start, r["end"], features, chunks, added, int(r.get("running", 0))))
    return sorted(steps, key=lambda s: s.start)


def overlap(step: Step, lo: float, hi: float) -> float:
    return max(0.0, min(step.end, hi) - max(step.start, lo))


def explain(
    row: dict[str, object],
    t0: float,
    steps: list[Step],
    classes: dict[str, str],
    coefficients: dict[str, float],
    seats: int,
) -> dict[str, object]:
    """How request row (of a repeat starting at wall clock t0) spent its time to first token."""
    arrival = t0 + float(row["arrival_s"])  # type: ignore[arg-type]
    first = arrival + float(row["ttft_s"])  # type: ignore[arg-type]
    rid = f"{ID_PREFIX}-{row['session']}-{row['turn']}"
    own = [s for s in steps if s.start <= first and s.end >= arrival and any(c[0] == rid for c in s.chunks)]
    base = {k: row[k] for k in ("workload", "session", "turn", "prompt", "cached", "ttft_s", "node")}
    if not own:
        return {**base, "found": False}
    worker = own[0].worker
    mine = [s for s in steps if s.worker == worker]
    # When each engine took it, within this wait (the same id comes again in a later repeat): more than
    # one when a worker refused it after its class's queue timeout and the gateway moved it.
    takes = sorted(
        (s.added[rid], s.worker)
        for s in steps
        if rid in s.added and arrival - CLOCK_SLACK_S <= s.added[rid] <= first
    )
    taken = max((t for t, w in takes if w == worker), default=arrival)
    began = max(own[0].start, taken)  # a chunk nested in a running step began when taken at the soonest
    moved = [[w, round(t - arrival, 3)] for t, w in takes if w != worker]
    by_kind: dict[str, float] = defaultdict(float)
    full = 0
    for s in mine:
        share = overlap(s, taken, began)
        if share <= 0:
            continue
        full += s.running >= seats
        others = {classes.get(c[0], "other") for c in s.chunks if c[0] != rid}
        by_kind["+".join(sorted(others)) + " prompts" if others else "decodes only"] += share
    busy = sum(by_kind.values())
    c = [coefficients[t] for t in TERMS]
    predicted = sum(sum(f * k for f, k in zip(s.features, c, strict=True)) for s in own)
    beside = sum(n for s in own for r, _, n in s.chunks if r != rid)
    other_busy = sum(overlap(s, arrival, first) for s in steps if s.worker != worker)
    return {
        **base,
        "found": True,
        "worker": worker,
        "to_engine_s": round((takes[0][0] if takes else arrival) - arrival, 3),
        "moved_from": moved,  # [worker, seconds after arrival it took the request] before a retry here
        "to_this_engine_s": round(taken - arrival, 3),
        "queued_s": round(began - taken, 3),  # on the worker that served it
        "nested": own[0].start < taken,
        "queued_in": {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "idle_s": round(began - taken - busy, 3),
        "seats_full_steps": full,
        "own_steps": len(own),
        "own_chunks": [[start, n] for s in own for r, start, n in s.chunks if r == rid],
        "own_steps_s": round(sum(s.seconds for s in own), 3),
        "own_steps_predicted_s": round(predicted, 3),
        "prompt_tokens_beside": beside,
        "tail_s": round(first - own[-1].end, 3),
        "other_worker_busy": round(other_busy / max(first - arrival, 1e-9), 3),
    }


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--result", type=Path, default=RESULT, help="a bench/sim_fidelity.py result")
    parser.add_argument(
        "--workload", default="realtime_chat", choices=DECODING, help="the class to look into (a decoder's)"
    )
    parser.add_argument("--top", type=positive(int), default=10, help="how many of its slowest requests")
    args = parser.parse_args(argv)
    steps_at = steps_dir(args.result) / "evaluation"
    for needed in (args.result, requests_path(args.result), steps_at):
        if not needed.exists():
            print(f"{needed} is missing: run bench/sim_fidelity.py (it writes all three)", file=sys.stderr)
            return 2
    run = json.loads(args.result.read_text())
    started = run.get("mesh", {}).get("repeat_started_unix")
    if not started:
        print(f"{args.result} has no repeat start times: rerun bench/sim_fidelity.py", file=sys.stderr)
        return 2
    try:
        steps = read_steps(steps_at, CHAT_MODEL)
    except ValueError as error:
        print(f"{error}; rerun bench/sim_fidelity.py", file=sys.stderr)
        return 2
    requests = json.loads(requests_path(args.result).read_text())
    rows = requests["real"]
    # The session's class by request id, as the step logs' chunks name them (the same in every repeat).
    classes = {f"{ID_PREFIX}-{r['session']}-{r['turn']}": str(r["workload"]) for r in rows}
    coefficients = run["calibration"]["coefficients"][CHAT_MODEL]
    mine = [r for r in rows if r["workload"] == args.workload and r["ttft_s"] is not None]
    slowest = sorted(mine, key=lambda r: -r["ttft_s"])[: args.top]
    seats = int(run["profile"]["max_running"])
    explained = [explain(r, started[r["repeat"]], steps, classes, coefficients, seats) for r in slowest]
    sim = {(r["session"], r["turn"]): r for r in requests["sim"]}
    for line in explained:
        twin = sim.get((line["session"], line["turn"]), {})
        print(json.dumps({**line, **{f"sim_{k}": twin.get(k) for k in ("ttft_s", "cached", "node")}}))
    found = [e for e in explained if e["found"]]
    summary: dict[str, object] = {"workload": args.workload, "requests": len(explained), "found": len(found)}
    for key in MEDIANS:
        values = [float(e[key]) for e in found]  # type: ignore[arg-type]
        summary[f"{key}_median"] = round(statistics.median(values), 3) if values else None
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
