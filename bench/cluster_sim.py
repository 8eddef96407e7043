"""Routing policies on a simulated GPU fleet (sim/), the placer's real decision code in the loop; prints
one JSON line on stdout, progress on stderr, and writes the comparison's plot.

    .venv/bin/python bench/cluster_sim.py [--quick] [--jobs N] [--plot FILE]

1. The comparison: every policy on one seeded trace over a fleet with severe cooling imbalance.
2. The sensitivity sweep: ours and least-loaded with no and mild imbalance too (severe is run 1's).
3. The scale run: ours on 8,000 GPUs (1,000 hosts x 8), wall time and picks per second.
4. Fidelity against the real mesh (bench/sim_fidelity.py: the simulator configured as the local two-worker
   mesh on this CPU's fitted step times, against `hanzo-mesh up` on the same trace): run in the full
   bench; --quick (which must stay under two minutes, too short to start and load a mesh) reports the
   last full fidelity run's result (.cache/bench/sim_fidelity.json, with its time) or null without one.
   --fidelity chooses either way (run, last, off).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

# Run as a script, Python put bench/ (not the repo root) on sys.path; `sim` and `services` live in the root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.progress import log
from sim import COMPILED
from sim.compare import run_policies
from sim.config import SimConfig, WorkloadConfig
from sim.fleet import Cooling, FleetLayout
from sim.plot import plot
from sim.policies import POLICIES
from sim.profiles import H200

FULL = {"hosts": 125, "minutes": 30.0, "scale_hosts": 1000, "scale_minutes": 5.0}
QUICK = {"hosts": 12, "minutes": 6.0, "scale_hosts": 1000, "scale_minutes": 0.25}
PLOT = Path(__file__).resolve().parents[1] / ".cache" / "bench" / "cluster_sim.png"
TARGETS = {"throttle_events_vs_least_loaded_max": 0.5, "batch_throughput_vs_best_min": 0.95}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller fleet for fewer minutes")
    parser.add_argument("--jobs", type=int, default=None, help="parallel runs (default: the CPUs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument(
        "--fidelity", choices=("run", "last", "off"), default=None,
        help="against the real mesh: run it (full default), the last run's result (quick default), or off",
    )  # fmt: skip
    return parser.parse_args()


def config(hosts: int, minutes: float, seed: int) -> SimConfig:
    return SimConfig(
        layout=FleetLayout(hosts=hosts), workload=WorkloadConfig(duration_s=minutes * 60), seed=seed
    )


def main() -> None:
    args = parse_args()
    plan = QUICK if args.quick else FULL
    started = time.perf_counter()
    base = config(int(plan["hosts"]), plan["minutes"], args.seed)
    log(f"comparison: {len(POLICIES)} policies, {base.layout.gpus} GPUs, {plan['minutes']} simulated minutes")
    runs = run_policies(base, list(POLICIES), args.jobs)
    comparison_wall = time.perf_counter() - started
    by_policy = {str(r["policy"]): r for r in runs}
    log(f"comparison done in {comparison_wall:.0f} s; sweep over cooling imbalance")
    sweep_runs = run_policies(base, ["least_loaded", "ours"], args.jobs, [Cooling.NONE, Cooling.MILD])
    sweep = {
        cooling.value: {str(r["policy"]): _thermal(r) for r in sweep_runs if r["cooling"] == cooling.value}
        for cooling in (Cooling.NONE, Cooling.MILD)
    }
    sweep[Cooling.SEVERE.value] = {p: _thermal(by_policy[p]) for p in ("least_loaded", "ours")}
    log(f"scale run: ours on {plan['scale_hosts'] * 8} GPUs for {plan['scale_minutes']} simulated minutes")
    scale_config = config(int(plan["scale_hosts"]), plan["scale_minutes"], args.seed)
    scale = run_policies(scale_config, ["ours"], 1)[0]

    fidelity = _fidelity(args.fidelity or ("last" if args.quick else "run"), args.seed)
    assert H200.thermal is not None
    plot_path = plot(runs, args.plot, H200.thermal.slowdown_c)
    ours, least = by_policy["ours"], by_policy["least_loaded"]
    batch = {p: r["classes"]["batch"]["output_tok_s"] for p, r in by_policy.items()}  # type: ignore[index]
    realtime = {p: r["classes"]["realtime_chat"]["slo_attainment"] for p, r in by_policy.items()}  # type: ignore[index]
    throttle_ratio = (
        ours["throttle_events"] / least["throttle_events"] if least["throttle_events"] else None  # type: ignore[operator]
    )
    batch_vs_best = batch["ours"] / max(batch.values()) if max(batch.values()) else None
    result = {
        "gpus": base.layout.gpus,
        "simulated_s": base.workload.duration_s,
        "wall_s": comparison_wall,
        "scale_gpus": scale_config.layout.gpus,
        "scale_simulated_s": scale_config.workload.duration_s,
        "scale_wall_s": scale["wall_s"],
        "scale_picks_per_s": scale["picks"] / scale["wall_s"],  # type: ignore[operator]
        "scale_pick_us_mean": scale["pick_us_mean"],
        "throttle_events_vs_least_loaded": throttle_ratio,
        "realtime_slo_attainment": realtime,
        "batch_output_tok_s": batch,
        "batch_throughput_vs_best": batch_vs_best,
        "sweep": sweep,
        "fidelity_ttft_p99_error": fidelity.get("fidelity_ttft_p99_error"),
        "fidelity_throughput_error": fidelity.get("fidelity_throughput_error"),
        "fidelity": fidelity,
        "policies": {p: {k: v for k, v in r.items() if k != "trace"} for p, r in by_policy.items()},
        "targets": TARGETS,
        "targets_met": {
            "throttle_events": throttle_ratio is not None
            and throttle_ratio <= TARGETS["throttle_events_vs_least_loaded_max"],
            "realtime_slo": (realtime["ours"] or 0)
            >= max(realtime["least_loaded"] or 0, realtime["prefix_load"] or 0),
            "batch_throughput": batch_vs_best is not None
            and batch_vs_best >= TARGETS["batch_throughput_vs_best_min"],
        },
        "plot": str(plot_path),
        "compiled": COMPILED,  # the simulator's hot modules ran compiled (sim/compiled.py)
        "quick": args.quick,
        "bench_seconds": time.perf_counter() - started,
    }
    print(json.dumps(result))


def _fidelity(mode: str, seed: int) -> dict[str, object]:
    """The fidelity figures (bench/sim_fidelity.py's result, less the per-class detail): measured now,
    read from the last full run, or none."""
    from bench.sim_fidelity import DEFAULT_OFFERED_LOAD, run_fidelity
    from bench.sim_fidelity import FULL as FIDELITY_FULL
    from bench.sim_fidelity import OUT as FIDELITY_OUT

    if mode == "off":
        return {"source": "off"}
    if mode == "run":
        log("fidelity: the local mesh and the simulator on one trace")
        result = run_fidelity(replace(FIDELITY_FULL, seed=seed), target_load=DEFAULT_OFFERED_LOAD)
        source = "run"
    elif FIDELITY_OUT.exists():
        result, source = json.loads(FIDELITY_OUT.read_text()), str(FIDELITY_OUT)
    else:
        return {"source": "none: run bench/sim_fidelity.py"}
    keep = (
        "fidelity_ttft_p99_error", "fidelity_ttft_p50_error", "fidelity_throughput_error", "weighted_errors",
        "errors", "offline_fidelity", "aggregation", "target", "window_s", "requests", "measured_at",
        "repeats", "between_repeats", "offered_load", "target_offered_load", "load_scale",
    )  # fmt: skip
    return {"source": source, **{k: result.get(k) for k in keep}}


def _thermal(run: dict[str, object]) -> dict[str, object]:
    return {
        "throttle_events": run["throttle_events"],
        "throttled_gpu_s": run["throttled_gpu_s"],
        "peak_temperature_c": run["peak_temperature_c"],
        "realtime_slo_attainment": run["classes"]["realtime_chat"]["slo_attainment"],  # type: ignore[index]
    }


if __name__ == "__main__":
    main()
