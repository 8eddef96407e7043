"""`hanzo-mesh up | demo | serve`: the whole mesh as local processes, optionally driven by a demo."""

from __future__ import annotations

import argparse
import asyncio
import secrets
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from services.common.redis_server import RedisNotInstalledError
from services.mesh.driver import DriveOptions, RequestResult, drive, wait_for_models
from services.mesh.models import CHAT_MODEL, EMBED_MODEL, ModelSet, prepare_models
from services.mesh.process import ServiceStartError
from services.mesh.prometheus import PrometheusNotInstalledError
from services.mesh.report import build_report, format_report, write_report
from services.mesh.serve import access_lines, add_serving_arguments, serving_models, worker_env
from services.mesh.service_env import service_env
from services.mesh.stack import Stack, StackConfig, format_process_table, new_run_dir
from services.mesh.supervise import Supervisor
from services.mesh.workload import PlannedRequest, plan_workload

DEFAULT_ROOT = Path(".cache/mesh")
# Seats per model on an `up`/`demo` worker, as many as the demo keeps in flight (--concurrency). The
# worker's default (64) is sized for a GPU: a CPU worker running 8 requests would read as nearly idle in
# the placer's load score, so the gateway's own rack (worker-1's) would win every pick and the other
# worker's core would sit unused; against 8 seats, load outweighs the rack after a request or two.
LOCAL_WORKER_ENV = service_env("worker", max_num_seqs=8)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 1..65535, got {value}")
    return value


def _port_or_free(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 1..65535 (0: a free one), got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The `hanzo-mesh` argument parser (subcommands up, demo and serve)."""
    parser = argparse.ArgumentParser(prog="hanzo-mesh", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the mesh and wait for Ctrl-C / SIGTERM")
    demo = sub.add_parser("demo", help="start the mesh, drive a mixed workload, print a per-class report")
    serve = sub.add_parser(
        "serve", help="serve these models (checkpoint directories, .gguf files or smollm2) until Ctrl-C"
    )
    add_serving_arguments(serve)
    serve.add_argument("--port", type=_port_or_free, default=50050, help="gateway gRPC port (default 50050)")
    serve.add_argument(
        "--http-port", type=_port_or_free, default=8000, help="OpenAI HTTP port (default 8000)"
    )
    serve.add_argument("--api-key", help="the key clients send (default: a fresh one, printed)")
    for p in (up, demo, serve):
        default_workers = 1 if p is serve else 2
        p.add_argument(
            "--workers", type=_positive_int, default=default_workers,
            help=f"worker processes (default {default_workers})",
        )  # fmt: skip
        p.add_argument("--redis-url", help="use this Redis instead of starting a private one")
        p.add_argument(
            "--base-port", type=_port, help="hand out ports upwards from here (default: free ports)"
        )
        p.add_argument(
            "--run-root", type=Path, default=DEFAULT_ROOT, help="run-<timestamp> log folders go here"
        )
        p.add_argument("--ready-timeout", type=_positive_float, default=180.0, help="seconds per service")
    for p in (up, serve):
        p.add_argument(
            "--prometheus", nargs="?", const=9090, type=_port_or_free, metavar="PORT",
            help="also run a local Prometheus (Debian's prometheus package) scraping every service, with "
            "the mesh's recording and alert rules, on PORT (default 9090; 0: a free one)",
        )  # fmt: skip
    demo.add_argument("--requests", type=_positive_int, default=120, help="requests to send (default 120)")
    demo.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    demo.add_argument(
        "--report", type=Path, default=DEFAULT_ROOT / "demo-report.json", help="JSON report path"
    )
    demo.add_argument("--rate", type=_positive_float, default=6.0, help="mean arrivals per second")
    demo.add_argument("--concurrency", type=_positive_int, default=8, help="most requests in flight")
    # Caps, not durations: the run ends with its last answer. The 120 requests arrive within ~20 s and
    # the real model then works through them at what the CPUs give; on a machine busy with other work
    # the lowest-priority batch documents wait longest, and these leave them room to finish.
    demo.add_argument(
        "--time-budget", type=_positive_float, default=180.0, help="seconds for the workload (default 180)"
    )
    demo.add_argument(
        "--request-timeout", type=_positive_float, default=90.0, help="deadline per request (default 90)"
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `hanzo-mesh`; returns the process exit code."""
    args = build_parser().parse_args(argv)
    # SIGTERM stops the mesh exactly like Ctrl-C; SIGINT is set explicitly because a shell starts
    # background jobs with SIGINT ignored, and `kill -INT` must still stop the mesh.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        return _demo(args) if args.command == "demo" else _up(args)
    except (RedisNotInstalledError, PrometheusNotInstalledError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _stack(args: argparse.Namespace) -> Stack:
    serving = args.command == "serve"
    extra: dict[str, Any] = {}
    if serving:
        models = serving_models(args.models, args.name)
        extra = {"gateway_port": args.port, "http_port": args.http_port, "worker_env": worker_env(args)}
    else:
        # up and demo serve the same real models: SmolLM2 for every decoding class, MiniLM for embeddings.
        models = prepare_models()
        extra = {"worker_env": LOCAL_WORKER_ENV}
    run_dir = new_run_dir(args.run_root)
    print(f"run directory (service logs): {run_dir}", flush=True)
    config = StackConfig(
        run_dir=run_dir,
        models=models,
        # A fresh key per run unless one is given: the demo exercises auth, nothing else can call.
        api_key=getattr(args, "api_key", None) or secrets.token_hex(16),
        workers=args.workers,
        redis_url=args.redis_url,
        base_port=args.base_port,
        ready_timeout_s=args.ready_timeout,
        prometheus_port=getattr(args, "prometheus", None),
        **extra,
    )
    return Stack(config)


def _models_line(models: ModelSet) -> str:
    return "models: " + ", ".join(f"{name} ({path})" for name, path in models.paths.items())


def _stop(stack: Stack) -> dict[str, int]:
    # A second Ctrl-C must not abandon half-stopped children; stopping is bounded by its own timeouts.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("stopping the mesh ...", flush=True)
    codes = stack.stop()
    bad = {name: code for name, code in codes.items() if code != 0}
    print(
        f"stopped; non-zero exit codes: {bad}" if bad else "stopped; every service exited with 0", flush=True
    )
    return codes


def _up(args: argparse.Namespace) -> int:
    try:
        stack = _stack(args)
    except ValueError as err:  # a MODEL that is neither a checkpoint nor a known name
        print(f"error: {err}", file=sys.stderr)
        return 2
    code = 0
    try:
        print("starting the mesh ...", flush=True)
        stack.start()
        print(f"\n{format_process_table(stack.services)}\n{_models_line(stack.config.models)}")
        prometheus = stack.prometheus.url if stack.prometheus is not None else ""
        print(access_lines(stack.gateway_address, stack.http_address, stack.config.api_key, prometheus))
        print("\nrunning; a service that exits is restarted; Ctrl-C or SIGTERM stops it", flush=True)
        supervisor = stack.supervisor(say=lambda line: print(line, flush=True))
        while True:  # until Ctrl-C / SIGTERM; a service given up on is reported and the rest serve on
            supervisor.tick()
            time.sleep(0.2)
    except ServiceStartError as err:
        print(f"error: {err}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        pass
    finally:
        _stop(stack)
    return code


def _demo(args: argparse.Namespace) -> int:
    plan = plan_workload(args.requests, args.seed, args.rate)
    stack = _stack(args)
    started = time.monotonic()
    results: list[RequestResult] = []
    supervisor: Supervisor | None = None
    try:
        print("starting the mesh ...", flush=True)
        stack.start()
        print(f"\ngateway: {stack.gateway_address}\n{format_process_table(stack.services)}", flush=True)
        print(f"{_models_line(stack.config.models)}\n", flush=True)
        supervisor = stack.supervisor(say=lambda line: print(line, flush=True))
        results = _drive_supervised(stack, args, plan, supervisor)
    except ServiceStartError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 1
    finally:
        dead = stack.exited()
        codes = _stop(stack)
    meta = _meta(args, stack, plan, codes, dead, time.monotonic() - started)
    meta["restarts"] = supervisor.restarts if supervisor is not None else {}
    report = build_report(results, meta)
    print("\n" + format_report(report))
    print(f"\nreport: {write_report(report, args.report).resolve()}")
    if meta["restarts"]:
        restarted = meta["restarts"]
        print(f"warning: service(s) restarted during the run: {restarted}; logs in {stack.config.run_dir}")
    if dead:
        print(f"warning: service(s) exited during the run: {dead}; logs in {stack.config.run_dir}")
    return 0 if report["ok"] and not dead else 1


def _drive_supervised(
    stack: Stack, args: argparse.Namespace, plan: list[PlannedRequest], supervisor: Supervisor
) -> list[RequestResult]:
    """The workload driven from a thread of its own while this (the main) thread supervises, as `up`
    does: a restarted service is started from the thread that outlives it (see process.py), and a
    restart that waits for its service never stalls the driver's clock."""
    results: list[RequestResult] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            results.extend(asyncio.run(_drive(stack, args, plan)))
        except BaseException as exc:  # re-raised in the main thread, where the CLI reports it
            failure.append(exc)

    driver = threading.Thread(target=run, name="demo-driver", daemon=True)
    driver.start()
    while driver.is_alive():
        supervisor.tick()
        driver.join(0.2)
    if failure:
        raise failure[0]
    return results


async def _drive(stack: Stack, args: argparse.Namespace, plan: list[PlannedRequest]) -> list[RequestResult]:
    # Imported here so `up` (which never drives traffic) does not need tqdm.
    from services.mesh.progress import ClassProgress

    w = args.workers
    want = {CHAT_MODEL: w, EMBED_MODEL: w}  # every worker holds both
    seen = await wait_for_models(stack.gateway_address, stack.config.api_key, want, timeout_s=30)
    print(f"models (replicas): {seen}", flush=True)
    options = DriveOptions(args.concurrency, args.request_timeout, args.time_budget)
    with ClassProgress(plan, enabled=not args.no_progress) as progress:
        return await drive(stack.gateway_address, stack.config.api_key, plan, options, progress.update)


def _meta(
    args: argparse.Namespace,
    stack: Stack,
    plan: list[PlannedRequest],
    codes: dict[str, int],
    dead: list[tuple[str, int]],
    wall_s: float,
) -> dict[str, Any]:
    return {
        "requests": len(plan),
        "seed": args.seed,
        "workers": args.workers,
        "rate_rps": args.rate,
        "concurrency": args.concurrency,
        "gateway": stack.gateway_address,
        "run_dir": str(stack.config.run_dir),
        "wall_s": round(wall_s, 1),
        "worker_models": {
            f"worker-{i + 1}": list(stack.config.models.for_worker(i)) for i in range(args.workers)
        },
        "exit_codes": codes,
        "exited_during_run": dict(dead),
    }
