"""The real side of bench/sim_fidelity.py: `hanzo-mesh up` with two workers logging their steps, warmed,
serving the calibration trace and then the evaluation trace as many times as asked, and what the run
measured besides the requests (CPU per process, engine steps, preemptions, dtypes). The mesh's telemetry
agents run their simulated GPU with no heating: their temperature would otherwise follow seat occupancy
past the slowdown threshold and steer the placer by heat a CPU does not have."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.chaos_mesh import UpProcess
from bench.fidelity_mesh_metrics import cpu_seconds, dtype_line, engine_steps, preemptions, worker_metrics
from bench.fidelity_replay import Tokens, replay
from bench.fidelity_steps import cut_logs, log_sizes
from bench.progress import log
from services.mesh.driver import wait_for_models
from sim.fidelity import CHAT_MODEL, EMBED_MODEL, Served
from sim.trace import Trace

REPEAT_TOKEN_SEED_STEP = 100  # repeat k's prompts are token ids of seed + 100 k (warm-up +1, calibration +2)
MESH_ENV = {"HANZO_TELEMETRY_SIM_HEATING_C_AT_FULL_LOAD": "0"}


def serve_on_mesh(
    trace: Trace,
    seed: int,
    words: list[str],
    steps: Path,
    calibration: Trace | None = None,
    repeats: int = 1,
) -> tuple[list[list[Served]], dict[str, object], list[Served]]:
    """Start `hanzo-mesh up` with step logs under steps, warm it, replay the calibration trace (if any;
    its steps copied to steps/calibration), then the trace repeats times (steps/evaluation), stop it;
    each repeat's requests as served, what the run measured, and the calibration trace's requests as
    served. Repeat k's prompts are token ids of seed + 100 k: the same lengths and sharing, no prefix
    cached by an earlier repeat."""
    calibration_served: list[Served] = []
    calibration_started: list[float] = []  # its time 0 on the wall clock, as the step logs' (one at most)
    served: list[list[Served]] = []
    with tempfile.TemporaryDirectory(prefix="sim-fidelity-") as root:
        step_logs = steps / "workers"
        env = {**MESH_ENV, "HANZO_WORKER_STEP_LOG_DIR": str(step_logs)}
        up = UpProcess(Path(root), workers=2, env=env)
        started = time.monotonic()
        up.start()
        try:
            ready_s = time.monotonic() - started
            want = {CHAT_MODEL: 2, EMBED_MODEL: 2}
            seen = asyncio.run(wait_for_models(up.gateway, up.api_key, want, timeout_s=60))
            log(f"mesh up in {ready_s:.0f} s, models {seen}; warming up")
            asyncio.run(replay(_warm_up(trace), up.gateway, up.api_key, Tokens(seed + 1, words)))
            if calibration is not None:
                log(f"calibration: {calibration.requests()} requests over {calibration.duration_s:.0f} s")
                before = log_sizes(step_logs)
                calibration_served = asyncio.run(
                    replay(
                        calibration, up.gateway, up.api_key, Tokens(seed + 2, words),
                        on_start=calibration_started.append,
                    )
                )  # fmt: skip
                cut_logs(step_logs, before, steps / "calibration")
            before = log_sizes(step_logs)
            preempted_before = preemptions(worker_metrics(up))
            pids = {**up.services(), "client": os.getpid()}
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            began = time.monotonic()
            repeat_started: list[float] = []  # each repeat's time 0 on the wall clock, as the step logs'
            for k in range(repeats):
                log(f"replaying {trace.requests()} requests over {trace.duration_s:.0f} s, {k + 1}/{repeats}")
                tokens = Tokens(seed + REPEAT_TOKEN_SEED_STEP * k, words)
                run = replay(trace, up.gateway, up.api_key, tokens, on_start=repeat_started.append)
                served.append(asyncio.run(run))
            wall = time.monotonic() - began
            # Where the two cores went while the trace ran: the workers' share is what the calibration
            # measured alone; the rest is what the simulator does not model.
            cpu = {name: round(cpu_seconds(pid) - cpu_before[name], 2) for name, pid in pids.items()}
            cut_logs(step_logs, before, steps / "evaluation")
            meta = {
                "mesh_ready_s": ready_s,
                "replay_wall_s": wall,
                "repeat_started_unix": repeat_started,
                "calibration_started_unix": calibration_started[0] if calibration_started else None,
                "models": seen,
                "cpu_s": cpu,
            }
            texts = worker_metrics(up)
            meta["engine_steps"] = engine_steps(texts)
            preempted = preemptions(texts).items()
            meta["preemptions"] = {c: n - preempted_before.get(c, 0.0) for c, n in preempted}
            # The dtype each worker's "auto" measured at its start (the calibration measured its own).
            logs = sorted(Path(root).glob("runs/*/worker-*.log"))
            meta["worker_dtypes"] = [dtype_line(log.read_text()) for log in logs]
        finally:
            meta_code = up.stop()
        meta["mesh_exit_code"] = meta_code
    return served, meta, calibration_served


def _warm_up(trace: Trace) -> Trace:
    """A few requests of the trace's first sessions at once, unmeasured: each worker's first steps build
    its kernels (the simulator's engines start warm)."""
    firsts = [replace(s, start_s=0.0, turns=s.turns[:1]) for s in trace.sessions[:6]]
    return Trace(1.0, tuple(firsts))
