"""A soak with faults: mixed gRPC and HTTP load through `hanzo-mesh up` (two workers on the real SmolLM2,
their telemetry agents, the placer, the gateway, a private Redis) while a seeded schedule SIGKILLs and
SIGSTOPs a worker and SIGKILLs the placer, a telemetry agent and Redis. Prints one JSON line.

    .venv/bin/python bench/chaos.py [--quick] [--seed N] [--duration S] [--spacing S] [--concurrency N]

1. `hanzo-mesh up` starts as a user starts it (a subprocess); its services are found among its child
   processes by what they run. Workers run float32 (--dtype) so that greedy outputs do not depend on
   which other requests share a batch.
2. Reference outputs: every prompt once over each transport (greedy, max_tokens tokens, ignore_eos).
3. Baseline, in the same run: --control seconds of the same closed-loop load with no fault. Its requests
   must all match their references; otherwise the comparison below would be measuring nondeterminism.
4. Faults: the same load for --duration seconds; a fault is injected when it is due and the mesh is whole
   again after the last one (every restarted service back, the stopped worker continued and listed). A
   stopped worker is continued after STOP_FOR_S.
5. Afterwards every request is judged against its reference (bench/chaos_load.py): completed,
   failed_clean, lost, corrupted, duplicated tokens; per fault, recovery_s is the time from the fault to
   the first request sent after it that completed, and back_s the time until the faulted service itself
   serves again (its supervisor's "is back" line; for a stopped worker, a request it served after SIGCONT),
   and whole_s the time until every service is back and the gateway lists every worker again.

Targets: lost, duplicated_tokens and corrupted 0; max_recovery_s <= 10; failed_clean only for requests
that had received tokens when their worker failed (failed_clean_before_tokens 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Run as a script, Python put bench/ (not the repo root) on sys.path; `bench` and `services` live in the root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc

from bench.chaos_faults import KINDS, STOP_FOR_S, Fault, inject, plan_faults, resume
from bench.chaos_load import MODEL, Clients, Outcome, Reference, closed_loop, judge, references
from bench.chaos_mesh import UpProcess
from hanzo.inference.v1 import inference_pb2
from services.mesh.driver import wait_for_models
from services.mesh.service_env import service_env

WORKERS = 2
MAX_RECOVERY_S = 10.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one round of faults, about two minutes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration", type=float, help="seconds of load with faults (default 600; quick 110)")
    parser.add_argument("--spacing", type=float, help="seconds between faults (default 30; quick 20)")
    parser.add_argument("--control", type=float, default=20.0, help="seconds of fault-free baseline load")
    parser.add_argument("--concurrency", type=int, default=6, help="closed-loop callers, half over HTTP")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--timeout", type=float, default=60.0, help="deadline per request (s)")
    parser.add_argument("--dtype", default="float32", help="the workers' HANZO_WORKER_DTYPE")
    parser.add_argument("--run-root", type=Path, help="where up's logs go (default: a temporary folder)")
    args = parser.parse_args(argv)
    args.duration = args.duration or (110.0 if args.quick else 600.0)
    args.spacing = args.spacing or (20.0 if args.quick else 30.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_root = args.run_root or Path(tempfile.mkdtemp(prefix="hanzo-chaos-"))
    up = UpProcess(run_root, WORKERS, env=service_env("worker", dtype=args.dtype))
    say(f"starting `hanzo-mesh up` (logs under {run_root}) ...")
    up.start()
    try:
        result = asyncio.run(run(up, args))
    finally:
        exit_code = up.stop()
    result["up_exit_code"] = exit_code
    result["run_root"] = str(run_root)
    print(json.dumps(result))
    return 0 if result["met"] and exit_code == 0 else 1


async def run(up: UpProcess, args: argparse.Namespace) -> dict[str, Any]:
    await wait_for_models(up.gateway, up.api_key, {MODEL: WORKERS}, timeout_s=120)
    clients = Clients(up.gateway, up.openai_url, up.api_key, args.max_tokens, args.timeout)
    try:
        say("reference outputs ...")
        refs = await references(clients, args.concurrency)
        say(f"baseline: {args.control:.0f} s of load, no faults ...")
        control = await closed_loop(clients, args.concurrency, time.monotonic() + args.control, args.seed)
        nodes = sorted(name.split(":", 1)[1] for name in up.services() if name.startswith("worker:"))
        faults = plan_faults(args.seed, nodes, 5.0, args.spacing, args.duration - args.spacing)
        say(f"faults: {[(f.kind, f.target, f.at_s) for f in faults]}")
        start = time.monotonic()
        load = asyncio.create_task(
            closed_loop(clients, args.concurrency, start + args.duration, args.seed + 1)
        )
        await inject_while(load, up, clients, faults, start)
        outcomes = await load
        whole_after_s = await wait_whole(up, clients, faults, timeout_s=180)
    finally:
        await clients.close()
    return summarize(args, refs, control, outcomes, faults, up, whole_after_s)


async def inject_while(
    load: asyncio.Task[list[Outcome]], up: UpProcess, clients: Clients, faults: list[Fault], start: float
) -> None:
    """Inject each fault when it is due and the mesh is whole; continue stopped workers after STOP_FOR_S."""
    pending = list(faults)
    while not load.done():
        now = time.monotonic()
        up.read_new()
        for fault in faults:
            if fault.injected_at is not None and now - fault.injected_at >= STOP_FOR_S:
                resume(fault, now)
        latest = next((f for f in reversed(faults) if f.injected_at is not None), None)
        settled = latest is None or recovered(latest, up)
        if latest is not None and latest.whole_at is None and settled and await is_whole(up, clients, faults):
            latest.whole_at = time.monotonic()
        if pending and now >= start + pending[0].at_s and settled and await is_whole(up, clients, faults):
            fault = pending.pop(0)
            try:
                inject(fault, up.services(), time.monotonic())
                say(f"{fault.injected_at - start:6.1f} s  {fault.kind} {fault.target} (pid {fault.pid})")
            except KeyError:
                say(f"skipped {fault.kind}: {fault.target} is not running")
        await asyncio.sleep(0.1)
    for fault in faults:  # the load is over: nothing stays stopped
        resume(fault, time.monotonic())


def recovered(fault: Fault, up: UpProcess) -> bool:
    """The fault has been answered: a stopped worker continued, a killed service said to be back since
    (before its supervisor even saw it exit, the mesh only looks whole)."""
    if _stops(fault):
        return fault.continued_at is not None
    name = _supervised_name(fault.target)
    at = fault.injected_at or 0.0
    return any(t >= at and line.startswith(f"{name} is back") for t, line in up.lines)


async def is_whole(up: UpProcess, clients: Clients, faults: list[Fault]) -> bool:
    """Every service that exited is back, every stopped worker continued, and every worker listed."""
    exited = [line for _, line in up.lines if re.search(r" exited with -?\d+; restarting", line)]
    back = [line for _, line in up.lines if " is back (pid" in line]
    if len(back) < len(exited) or any(f.injected_at and f.continued_at is None for f in faults if _stops(f)):
        return False
    try:
        listed = await clients.stub.ListModels(
            inference_pb2.ListModelsRequest(), metadata=clients.metadata, timeout=5
        )
    except grpc.aio.AioRpcError:  # the gateway cannot list them yet: not whole
        return False
    return any(m.name == MODEL and m.replicas >= WORKERS for m in listed.models)


async def wait_whole(up: UpProcess, clients: Clients, faults: list[Fault], timeout_s: float) -> float | None:
    """Seconds until the mesh is whole after the load ended; None if it is not within timeout_s."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        up.read_new()
        if await is_whole(up, clients, faults):
            return round(time.monotonic() - began, 1)
        await asyncio.sleep(0.2)
    return None


def summarize(
    args: argparse.Namespace,
    refs: dict[tuple[str, int], Reference],
    control: list[Outcome],
    outcomes: list[Outcome],
    faults: list[Fault],
    up: UpProcess,
    whole_after_s: float | None,
) -> dict[str, Any]:
    verdicts = [judge(o, refs[(o.transport, o.prompt)], args.max_tokens) for o in outcomes]
    base = [judge(o, refs[(o.transport, o.prompt)], args.max_tokens) for o in control]
    completed = [o for o, v in zip(outcomes, verdicts, strict=True) if v.kind == "completed"]
    per_fault = [fault_report(f, completed, up) for f in faults if f.injected_at is not None]
    recoveries = [f["recovery_s"] for f in per_fault]
    max_recovery = None if None in recoveries or not recoveries else max(recoveries)

    def count(kind: str) -> int:
        return sum(v.kind == kind for v in verdicts)

    result: dict[str, Any] = {
        "bench": "chaos",
        "quick": args.quick,
        "seed": args.seed,
        "dtype": args.dtype,
        "duration_s": args.duration,
        "requests": len(outcomes),
        "completed": count("completed"),
        "failed_clean": count("failed_clean"),
        "failed_clean_before_tokens": sum(v.before_tokens for v in verdicts),
        "lost": count("lost"),
        "duplicated_tokens": sum(v.duplicated for v in verdicts),
        "corrupted": count("corrupted"),
        "max_recovery_s": max_recovery,
        "faults_injected": len(per_fault),
        "faults_planned": len(faults),
        "whole_after_s": whole_after_s,
        "failed_statuses": _tally(
            o.status for o, v in zip(outcomes, verdicts, strict=True) if v.kind != "completed"
        ),
        "e2e_p50_s": _p50(completed),
        "baseline": {
            "requests": len(control),
            "completed": sum(v.kind == "completed" for v in base),
            "corrupted": sum(v.kind == "corrupted" for v in base),
            "e2e_p50_s": _p50([o for o, v in zip(control, base, strict=True) if v.kind == "completed"]),
        },
        "faults": per_fault,
        "restarts": _tally(
            m.group(1) for _, line in up.lines if (m := re.match(r"(\S+) is back \(pid", line))
        ),
    }
    result["met"] = (
        result["lost"] == 0
        and result["duplicated_tokens"] == 0
        and result["corrupted"] == 0
        and result["failed_clean_before_tokens"] == 0
        and max_recovery is not None
        and max_recovery <= MAX_RECOVERY_S
        and result["baseline"]["completed"] == result["baseline"]["requests"]
        and whole_after_s is not None
        and result["faults_injected"] == result["faults_planned"]
    )
    return result


def fault_report(fault: Fault, completed: list[Outcome], up: UpProcess) -> dict[str, Any]:
    """recovery_s: fault to the first completion of a request sent after it; back_s: fault (a stopped
    worker: SIGCONT) to the faulted service serving again."""
    at = fault.injected_at or 0.0
    after = [o.ended for o in completed if o.sent >= at and o.ended is not None]
    back_s = None
    if _stops(fault):
        node = fault.target.split(":", 1)[1]
        resumed = fault.continued_at
        served = [o.ended for o in completed if o.node_id == node and resumed and o.sent >= resumed]
        back_s = min(served) - resumed if served and resumed else None
    else:
        name = _supervised_name(fault.target)
        lines = [t for t, line in up.lines if t >= at and line.startswith(f"{name} is back")]
        back_s = min(lines) - at if lines else None
    return {
        "kind": fault.kind,
        "target": fault.target,
        "planned_at_s": fault.at_s,
        "recovery_s": round(min(after) - at, 2) if after else None,
        "back_s": round(back_s, 2) if back_s is not None else None,
        # Fault to every service back, the stopped worker continued and every worker listed again.
        "whole_s": round(fault.whole_at - at, 2) if fault.whole_at is not None else None,
    }


def _stops(fault: Fault) -> bool:
    return KINDS[fault.kind][1].name == "SIGSTOP"


def _supervised_name(target: str) -> str:
    """The supervisor's name for a service: worker:mesh-w2 -> worker-2, placer -> placer."""
    service, _, node = target.partition(":")
    return f"{service}-{node.removeprefix('mesh-w')}" if node else service


def _p50(outcomes: list[Outcome]) -> float | None:
    times = [o.ended - o.sent for o in outcomes if o.ended is not None]
    return round(statistics.median(times), 3) if times else None


def _tally(items: Iterable[str]) -> dict[str, int]:
    return dict(Counter(items))


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
