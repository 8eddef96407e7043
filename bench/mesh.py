"""What the mesh adds to a request: the same seeded requests straight to one worker (Worker.Generate, the
baseline) and through the gateway (Inference.Generate: auth, validation, classification, a pick by the
gateway's placer replica, or with `--placement remote` a Placer.Pick round trip, and a proxy hop over the
gateway's GenerateStreams link to the worker), in one
run; prints one JSON line on stdout, progress on stderr. Every request names its workload class, so the
worker schedules the two routes' copies alike.

    .venv/bin/python bench/mesh.py [--quick] [--worker-threads N] [--model-dir DIR]

Real processes on free ports: a private Redis, `python -m services.placer`, ONE `services.worker` with a
small generated Llama, `services.gateway` with one API key (sent on every gateway call).

Latency (serial, one stream in flight): every round sends each request once per route, back to back, the
route that goes first rotating by request and round so machine drift hits every route alike. For request i,
added_i = median over rounds of (gateway TTFT - direct TTFT) of the same (round, i);
gateway_added_ms_p50/p99 are percentiles (linear interpolation) of added_i across requests. A third route, a
bare grpc.aio pass-through to the same worker (bench/mesh_proxy.py), runs in the same rounds:
bare_proxy_added_ms_* is what one Python gRPC hop costs here with a Generate call per request,
gateway_over_bare_proxy_ms_p50 what the gateway adds to it (its own work, less what its link saves over
a call per request; below zero when the saving is larger). TTFT = call start to the first streamed
message, measured in this client.
Throughput: every request of a second set with `--in-flight` streams open (a closed loop), direct and
gateway passes alternating per round; tok/s = streamed token ids / pass wall time; mesh_throughput_ratio =
the median over rounds of gateway tok/s / direct tok/s of the same round. With 2+ cores the worker runs
alone on the first core and everything else on the rest (--no-pin: not). Every stream must carry exactly
max_tokens ids, the same on both routes (greedy): counted, not asserted.
CPU per request of gateway, worker and placer is read from /proc per route, to show where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

# Run as a script, Python put bench/ (not the repo root) on sys.path; `bench` and `services` live in the root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import mesh_stats as st
from bench.mesh_client import Route, Timed, concurrent_pass, make_requests
from bench.mesh_stack import MODEL_NAME, MODEL_SPEC, MeshStack, ensure_model
from bench.progress import log
from hanzo.inference.v1 import common_pb2

DEFAULT_MODEL_DIR = Path(".cache/bench/mesh-model")
RUN_DIR = Path(".cache/bench/mesh-run")  # service logs of the last run
API_KEY = "bench-mesh-key"
TARGETS = {"gateway_added_ms_p50": 2.0, "gateway_added_ms_p99": 5.0, "mesh_throughput_ratio": 0.9}
# Prompt lengths (tokens) cycle over the requests: chat turns to a long-ish context.
LATENCY_PROMPT_LENS = (8, 32, 128, 384)
THROUGHPUT_PROMPT_LENS = (8, 16, 32, 64)
FULL = {"requests": 64, "rounds": 9, "max_tokens": 8, "tp_requests": 480, "tp_rounds": 5, "tp_max_tokens": 16}
QUICK = {
    "requests": 24,
    "rounds": 5,
    "max_tokens": 8,
    "tp_requests": 160,
    "tp_rounds": 3,
    "tp_max_tokens": 16,
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds: under two minutes")
    parser.add_argument("--in-flight", type=int, default=16, help="open streams in the throughput phase")
    parser.add_argument(
        "--worker-threads",
        type=int,
        default=1,
        help="the worker's OMP threads (default 1: on a 2-core machine the other core is left to the "
        "gateway, placer and this client, instead of torch spinning on both); 0 = torch's default",
    )
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument(
        "--placement",
        choices=("remote", "embedded"),
        default="embedded",
        help="gateway picks via the placer service (remote) or an in-process placer replica (embedded)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave every process on every core (default with 2+ cores: the worker alone on core 0, the "
        "gateway, placer, Redis and this client on the others, as on a GPU node where they run elsewhere)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.in_flight < 1 or args.worker_threads < 0:
        parser.error("--in-flight must be >= 1 and --worker-threads >= 0")
    return args


class CpuLedger:
    """CPU seconds each service process spent, charged to the route whose calls ran meanwhile (read from
    /proc between calls, outside the timed part), so the report says which process the gateway route costs."""

    def __init__(self, stack: MeshStack) -> None:
        self.stack = stack
        self.spent: dict[str, dict[str, float]] = {}
        self.calls: dict[str, int] = {}

    def charge(self, route: str, before: dict[str, float], calls: int) -> None:
        after = self.stack.cpu_s()
        row = self.spent.setdefault(route, dict.fromkeys(after, 0.0))
        for name, value in after.items():
            row[name] += value - before[name]
        self.calls[route] = self.calls.get(route, 0) + calls

    def ms_per_request(self) -> dict[str, dict[str, float]]:
        """route -> process -> CPU ms per request (clock-tick resolution, 10 ms, averaged over many calls)."""
        return {
            route: {name: s * 1e3 / self.calls[route] for name, s in row.items()}
            for route, row in self.spent.items()
        }


async def latency_phase(
    routes: list[Route], requests: list, rounds: int, cpu: CpuLedger
) -> dict[str, list[list[Timed]]]:
    """Per route name, results[round][index]; serial: one stream in flight at any time. routes[0] is the
    direct baseline and routes[1] the gateway; which route goes first rotates by request and round."""
    direct, gateway = routes[0], routes[1]
    grids: dict[str, list[list[Timed]]] = {route.name: [] for route in routes}
    for r in range(rounds):
        rows: dict[str, list[Timed]] = {route.name: [] for route in routes}
        for i, request in enumerate(requests):
            k = (i + r) % len(routes)
            for route in routes[k:] + routes[:k]:
                before = cpu.stack.cpu_s()
                rows[route.name].append(await route.timed(request))
                cpu.charge(route.name, before, 1)
        for name, row in rows.items():
            grids[name].append(row)
        added = st.paired_added_s([rows[gateway.name]], [rows[direct.name]], "ttft_s")
        log(f"latency round {r + 1}/{rounds}: added TTFT median {statistics.median(added) * 1e3:.2f} ms")
    return grids


async def throughput_phase(
    direct: Route, gateway: Route, requests: list, rounds: int, in_flight: int, cpu: CpuLedger
) -> dict[str, list]:
    """Per route, one Pass per round; the route that goes first alternates by round."""
    passes: dict[str, list] = {direct.name: [], gateway.name: []}
    for r in range(rounds):
        for route in (direct, gateway) if r % 2 == 0 else (gateway, direct):
            before = cpu.stack.cpu_s()
            result = await concurrent_pass(route, requests, in_flight)
            cpu.charge(route.name, before, len(requests))
            passes[route.name].append(result)
            log(f"throughput {r + 1}/{rounds} {route.name}: {result.tok_s:.0f} tok/s, {result.wall_s:.2f} s")
    return passes


async def measure(stack: MeshStack, cfg: dict[str, int], in_flight: int, seed: int) -> dict[str, object]:
    """Both phases against a running stack; the measured part of the JSON result."""
    vocab = MODEL_SPEC["vocab_size"]
    lat_requests = make_requests(
        MODEL_NAME, cfg["requests"], LATENCY_PROMPT_LENS, cfg["max_tokens"], vocab, seed,
        common_pb2.WORKLOAD_CLASS_REALTIME_CHAT,
    )  # fmt: skip
    tp_requests = make_requests(
        MODEL_NAME, cfg["tp_requests"], THROUGHPUT_PROMPT_LENS, cfg["tp_max_tokens"], vocab, seed + 1,
        common_pb2.WORKLOAD_CLASS_BATCH,
    )  # fmt: skip
    direct = Route("direct", stack.worker_address, via_gateway=False)
    gateway = Route("gateway", stack.gateway_address, True, (("authorization", f"Bearer {API_KEY}"),))
    proxy = Route("bare_proxy", stack.proxy_address, via_gateway=False)
    try:
        # Warm-up: channels connected, the gateway's channel to the worker opened, and every latency prompt
        # once in the worker's prefix cache, so round 1 is not the only one that pays for cold prefills.
        log("warm-up")
        for request in lat_requests:
            for route in (direct, gateway, proxy):
                await route.timed(request)
        await concurrent_pass(direct, tp_requests[: in_flight * 2], in_flight)
        await concurrent_pass(gateway, tp_requests[: in_flight * 2], in_flight)
        log(f"latency: {len(lat_requests)} requests x {cfg['rounds']} rounds per route, serial")
        lat_cpu, tp_cpu = CpuLedger(stack), CpuLedger(stack)
        grids = await latency_phase([direct, gateway, proxy], lat_requests, cfg["rounds"], lat_cpu)
        d_grid, g_grid, p_grid = grids["direct"], grids["gateway"], grids["bare_proxy"]
        log(f"throughput: {len(tp_requests)} requests, {in_flight} in flight, {cfg['tp_rounds']} rounds")
        passes = await throughput_phase(direct, gateway, tp_requests, cfg["tp_rounds"], in_flight, tp_cpu)
    finally:
        await direct.close()
        await gateway.close()
        await proxy.close()
    added_ttft = st.paired_added_s(g_grid, d_grid, "ttft_s")
    proxy_ttft = st.paired_added_s(p_grid, d_grid, "ttft_s")
    over_proxy = st.paired_added_s(g_grid, p_grid, "ttft_s")
    added_e2e = st.paired_added_s(g_grid, d_grid, "e2e_s")
    d_tp = [[t for t in p.results] for p in passes["direct"]]
    g_tp = [[t for t in p.results] for p in passes["gateway"]]
    direct_tok_s = statistics.median(p.tok_s for p in passes["direct"])
    gateway_tok_s = statistics.median(p.tok_s for p in passes["gateway"])
    round_ratios = [g.tok_s / d.tok_s for g, d in zip(passes["gateway"], passes["direct"], strict=True)]
    return {
        "gateway_added_ms_p50": st.percentile_ms(added_ttft, 50),
        "gateway_added_ms_p99": st.percentile_ms(added_ttft, 99),
        # A bare grpc.aio pass-through (bench/mesh_proxy.py, a Generate call per request) in the same
        # rounds, and what the gateway adds on top of it (auth, validation, classification, the pick,
        # tracing, metrics, less what the GenerateStreams link saves over a call per request).
        "bare_proxy_added_ms_p50": st.percentile_ms(proxy_ttft, 50),
        "bare_proxy_added_ms_p99": st.percentile_ms(proxy_ttft, 99),
        "gateway_over_bare_proxy_ms_p50": st.percentile_ms(over_proxy, 50),
        "gateway_added_e2e_ms_p50": st.percentile_ms(added_e2e, 50),
        "gateway_added_e2e_ms_p99": st.percentile_ms(added_e2e, 99),
        "direct_ttft_ms_p50": st.percentile_ms(st.flat(d_grid, "ttft_s"), 50),
        "gateway_ttft_ms_p50": st.percentile_ms(st.flat(g_grid, "ttft_s"), 50),
        "direct_ttft_ms_p99": st.percentile_ms(st.flat(d_grid, "ttft_s"), 99),
        "gateway_ttft_ms_p99": st.percentile_ms(st.flat(g_grid, "ttft_s"), 99),
        "direct_e2e_ms_p50": st.percentile_ms(st.flat(d_grid, "e2e_s"), 50),
        "gateway_e2e_ms_p50": st.percentile_ms(st.flat(g_grid, "e2e_s"), 50),
        # Paired by round (both routes ran back to back under the same machine state), then the median.
        "mesh_throughput_ratio": statistics.median(round_ratios),
        "ratio_of_median_tok_s": gateway_tok_s / direct_tok_s,
        "direct_tok_s": direct_tok_s,
        "gateway_tok_s": gateway_tok_s,
        "throughput_ratio_per_round": round_ratios,
        # Where the gateway route's time goes: CPU per request of each service process, per route and phase.
        "cpu_ms_per_request": {"latency": lat_cpu.ms_per_request(), "throughput": tp_cpu.ms_per_request()},
        "requests": len(lat_requests),
        "rounds": cfg["rounds"],
        "throughput_requests": len(tp_requests),
        "throughput_rounds": cfg["tp_rounds"],
        "in_flight": in_flight,
        "max_tokens": {"latency": cfg["max_tokens"], "throughput": cfg["tp_max_tokens"]},
        "prompt_lens": {"latency": LATENCY_PROMPT_LENS, "throughput": THROUGHPUT_PROMPT_LENS},
        # (round, request) pairs whose ids differ between direct and gateway, latency + throughput phases.
        "token_mismatches": st.mismatches(d_grid, g_grid)
        + st.mismatches(d_grid, p_grid)
        + st.mismatches(d_tp, g_tp),
        "wrong_length_streams": st.wrong_lengths(d_grid + g_grid + p_grid, cfg["max_tokens"])
        + st.wrong_lengths(d_tp + g_tp, cfg["tp_max_tokens"]),
        "unstable_across_rounds": st.unstable(d_grid + g_grid) + st.unstable(d_tp + g_tp),
    }


def main() -> None:
    args = parse_args()
    bench_start = time.perf_counter()
    load_start = list(os.getloadavg())
    cfg = QUICK if args.quick else FULL
    model_dir = ensure_model(args.model_dir)
    shutil.rmtree(RUN_DIR, ignore_errors=True)  # the children append to their logs: start them empty
    stack = MeshStack(RUN_DIR.resolve(), model_dir, API_KEY, args.worker_threads or None, args.placement)
    log(f"starting redis, placer, worker ({model_dir}), gateway; logs in {RUN_DIR}")
    cpus = sorted(os.sched_getaffinity(0))
    pinning = None if args.no_pin or len(cpus) < 2 else {"worker": cpus[:1], "mesh_and_client": cpus[1:]}
    with stack:
        log(f"worker {stack.worker_address} (pid {stack.worker_pid}), gateway {stack.gateway_address} "
            f"(pid {stack.gateway_pid}), pinning {pinning}")  # fmt: skip
        if pinning is not None:
            stack.pin(set(pinning["worker"]), set(pinning["mesh_and_client"]))
        measured = asyncio.run(measure(stack, cfg, args.in_flight, args.seed))
    result = {
        **measured,
        "targets": TARGETS,
        "targets_met": {
            "gateway_added_ms_p50": measured["gateway_added_ms_p50"] < TARGETS["gateway_added_ms_p50"],
            "gateway_added_ms_p99": measured["gateway_added_ms_p99"] < TARGETS["gateway_added_ms_p99"],
            "mesh_throughput_ratio": measured["mesh_throughput_ratio"] >= TARGETS["mesh_throughput_ratio"],
        },
        "worker_threads": args.worker_threads or None,
        "placement": args.placement,
        "cpu_pinning": pinning,
        "model": {"dir": str(model_dir), **MODEL_SPEC},
        "quick": args.quick,
        "cpus": os.cpu_count(),
        # Other jobs on this machine inflate every timing; the load average says when a run was contended.
        "loadavg_start_end": [load_start, list(os.getloadavg())],
        "bench_seconds": time.perf_counter() - bench_start,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
