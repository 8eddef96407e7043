"""python -m sim: routing policies on one simulated fleet and trace; one JSON line on stdout.

.venv/bin/python -m sim [--policies ours,least_loaded] [--hosts 125] [--minutes 30]
                        [--cooling severe] [--seed 0] [--jobs 2] [--plot FILE] [--weights FILE]
                        [--planner] [--host-copies llama-70b,llama-8b]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from services.placer.pick.weights import ClassWeights
from sim import COMPILED
from sim.cli_args import positive
from sim.compare import run_policies
from sim.config import SimConfig, WorkloadConfig
from sim.fleet import Cooling, FleetLayout
from sim.plot import plot
from sim.policies import EXPERIMENTS, POLICIES
from sim.profiles import H200


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--policies", default=",".join(POLICIES),
        help=f"comma-separated, of: {', '.join(POLICIES)} (the default), and the experiment "
        f"{', '.join(EXPERIMENTS)} (sim/latency_reserve.py; ours without its prefix cost rule)",
    )  # fmt: skip
    parser.add_argument("--hosts", type=positive(int), default=125, help="8-GPU hosts (125: 1,000 GPUs)")
    parser.add_argument("--gpus-per-host", type=positive(int), default=8)
    parser.add_argument("--minutes", type=positive(float), default=30.0, help="simulated minutes")
    parser.add_argument("--cooling", choices=[c.value for c in Cooling], default=Cooling.SEVERE.value)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load-scale", type=positive(float), default=1.0, help="multiply every arrival rate")
    parser.add_argument("--jobs", type=positive(int), default=None, help="parallel runs (default: the CPUs)")
    parser.add_argument("--plot", type=Path, default=None, help="write the comparison as a PNG here")
    parser.add_argument(
        "--planner", action="store_true",
        help="ours with the placer's replica planner loading and evicting models (sim/planner.py)",
    )  # fmt: skip
    parser.add_argument(
        "--host-copies", default="", metavar="MODELS",
        help="comma-separated models every host keeps in host memory besides its own: a request routed "
        "to one reloads it, and --planner moves them ahead of requests",
    )  # fmt: skip
    parser.add_argument(
        "--reserve-seats", type=positive(float), default=SimConfig.reserve_seats, metavar="SEATS",
        help="ours_reserve: latency requests per reserved node it sizes its reserve for",
    )  # fmt: skip
    parser.add_argument(
        "--node-reserve", type=float, default=SimConfig.node_reserve_fraction, metavar="FRACTION",
        help="ours: the share of nodes the placer's node_reserve scorer keeps for the latency classes, "
        "where --weights weighs it (HANZO_PLACER_NODE_RESERVE_FRACTION)",
    )  # fmt: skip
    parser.add_argument(
        "--weights", type=Path, default=None,
        help="JSON overrides of ours's per-class weights, as HANZO_PLACER_WEIGHTS_FILE holds them",
    )  # fmt: skip
    return parser.parse_args(argv)


def config_of(args: argparse.Namespace) -> SimConfig:
    workload = WorkloadConfig(duration_s=args.minutes * 60)
    scale = args.load_scale
    workload = replace(
        workload,
        chat_rate=workload.chat_rate * scale,
        agent_rate=workload.agent_rate * scale,
        batch_rate=workload.batch_rate * scale,
        embedding_rate=workload.embedding_rate * scale,
    )
    copies = tuple(m.strip() for m in args.host_copies.split(",") if m.strip())
    unknown = sorted(set(copies) - set(H200.models))
    if unknown:
        raise ValueError(f"--host-copies {unknown}: not models of the profile ({sorted(H200.models)})")
    layout = FleetLayout(hosts=args.hosts, gpus_per_host=args.gpus_per_host, host_copies=copies)
    if not 0.0 <= args.node_reserve <= 1.0:
        raise ValueError(f"--node-reserve {args.node_reserve}: a share of the nodes, from 0 to 1")
    weights = json.loads(args.weights.read_text()) if args.weights else {}
    ClassWeights.from_config(weights)  # a bad file fails here, naming the culprit, not in a worker process
    return SimConfig(
        layout=layout, workload=workload, cooling=Cooling(args.cooling), seed=args.seed,
        class_weights=weights, replica_planner=args.planner, reserve_seats=args.reserve_seats,
        node_reserve_fraction=args.node_reserve,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = sorted(set(policies) - set(POLICIES) - set(EXPERIMENTS))
    if unknown:
        print(
            f"unknown policies {unknown}; known: {sorted(POLICIES)} and {sorted(EXPERIMENTS)}",
            file=sys.stderr,
        )
        return 2
    try:
        config = config_of(args)
    except (OSError, ValueError) as error:  # an unreadable or bad --weights file (JSON errors too)
        where = "" if str(error).startswith("--") else f"--weights {args.weights}: "
        print(f"{where}{error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    runs = run_policies(config, policies, args.jobs)
    out: dict[str, object] = {
        "gpus": config.layout.gpus,
        "simulated_s": config.workload.duration_s,
        "cooling": config.cooling.value,
        "seed": config.seed,
        "wall_s": time.perf_counter() - started,
        "compiled": COMPILED,  # the hot modules ran compiled (sim/compiled.py), else their source
        "policies": {str(r["policy"]): {k: v for k, v in r.items() if k != "trace"} for r in runs},
    }
    if args.plot is not None:
        assert H200.thermal is not None
        out["plot"] = str(plot(runs, args.plot, H200.thermal.slowdown_c))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
