"""The fleet simulator's fidelity: one seeded trace served by the real local mesh (`hanzo-mesh up`: two
workers on SmolLM2 and MiniLM) and by the simulator configured as that mesh (sim/fidelity.py), with
TTFT p50 / p99 and throughput per class from both and their relative errors; one JSON line on stdout,
progress on stderr, the result also written to .cache/bench/sim_fidelity.json, every request on both
sides to sim_fidelity_requests.json beside it and the mesh workers' step logs under sim_fidelity_steps/
(bench/fidelity_waits.py reads the three together: what the slowest real requests waited for).

    .venv/bin/python bench/sim_fidelity.py [--quick] [--seed 0] [--offered-load 0.5 | --load-scale S]
        [--sim-only | --resimulate]

The CPU profile comes from sim/calibrate.py (measured once per machine and cached). The mesh's telemetry
agents run their simulated GPU with no heating (HANZO_TELEMETRY_SIM_HEATING_C_AT_FULL_LOAD=0): their
temperature would otherwise follow seat occupancy to past the slowdown threshold and steer the placer by
heat a CPU does not have; the simulated mesh is thermally neutral the same way (sim/cpu_profile.py).
Headline errors are the worst class's (the target holds for each); request-weighted means beside them.
fit_spread: the simulated side again on --fit-refits refits of the step costs (each to a bootstrap
resample of the calibration trace's steps), each figure's range over them, and how far the real one lies
outside it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench.fidelity_mesh import serve_on_mesh
from bench.fidelity_records import fitted_overhead_s, requests_path, row_of
from bench.fidelity_resimulate import resimulate
from bench.fidelity_steps import out_of_sample, steps_dir
from sim.calibrate import calibrate, single_token_words
from sim.cli_args import count
from sim.cpu_profile import cpu_profile
from sim.fidelity import (
    CHAT_MODEL,
    EMBED_MODEL,
    METRICS,
    FidelityPlan,
    class_metrics,
    headline,
    headlines,
    load_scale_of,
    make_trace,
    matched_metrics,
    mesh_workload,
    metric_ranges,
    metrics_on,
    offered_load,
    outside_range,
    pooled_metrics,
    preemptions_by_class,
    relative_errors,
    routing_shares,
    simulate,
    weighted,
)
from sim.fidelity_load import plan_for_load
from sim.fleet import NetworkCosts
from sim.serving_fit import logs_by_model, serving_calibration
from sim.sharegpt import Conversation, conversations
from sim.trace import Trace

FULL = FidelityPlan(mesh_workload(180.0))
QUICK = FidelityPlan(mesh_workload(40.0))
CONVERSATIONS = 3000  # as sim/compare.py samples
OUT = Path(__file__).resolve().parents[1] / ".cache" / "bench" / "sim_fidelity.json"
OUT_QUICK = OUT.with_name("sim_fidelity_quick.json")
TARGET = 0.15
CALIBRATION_SEED_OFFSET = 1000  # the calibration trace's seed: never the trace the errors are measured on
CALIBRATION_MAX_S = 180.0  # ~3,000 logged steps a worker: past that a longer calibration adds only drift
# The trace's default load on this machine: the mesh scale's rates offered 0.35-1.47 of the capacity of
# the machines the bench has run on, and past ~0.6 the tail is queues and refusals (docs/simulator.md).
DEFAULT_OFFERED_LOAD = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 40 s trace instead of 180 s")
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="the trace's window (default 180; --quick 40); the calibration trace is as long, at most 180 s",
    )
    parser.add_argument(
        "--repeats", type=int, default=1,
        help="serve the trace this many times on the real mesh, each with prompts of other token ids "
        "(no cache hits across repeats); the real figures pool them, and their spread is reported",
    )  # fmt: skip
    parser.add_argument(
        "--offered-load", type=float, default=None,
        help=f"scale every class's session rate until the simulated mesh on this machine's profile is "
        f"offered this load (default {DEFAULT_OFFERED_LOAD}): the same operating point on any machine",
    )  # fmt: skip
    parser.add_argument(
        "--load-scale", type=float, default=None,
        help="every class's session rate times this instead (1: the mesh scale's rates, whatever load "
        "they offer this machine); the mix stays",
    )  # fmt: skip
    parser.add_argument(
        "--fit-refits", type=count, default=20,
        help="simulate again on this many refits of the step costs, each to a bootstrap resample of the "
        "calibration's logged steps: the range the fit's uncertainty spans (0: none)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sim-only", action="store_true", help="only the simulated side (sizing the trace)")
    parser.add_argument(
        "--resimulate", action="store_true",
        help="the simulated side again against the last run's real side and serving calibration (no mesh)",
    )  # fmt: skip
    return parser.parse_args(argv)


def _worst(runs: list[dict[str, dict[str, float | None]]], metric: str) -> float | None:
    """The worst class's error on metric over every run's errors; None without runs."""
    found = [value for errors in runs if (value := headline(errors, metric)) is not None]
    return max(found) if found else None


def run_fidelity(
    plan: FidelityPlan,
    sim_only: bool = False,
    out: Path = OUT,
    calibration_window_s: float | None = None,
    repeats: int = 1,
    fit_refits: int = 0,
    target_load: float | None = None,
) -> dict[str, object]:
    """The simulated side on the offline calibration, then (unless sim_only) the real mesh: a calibration
    trace of its own seed (calibration_window_s long, default the plan's window up to CALIBRATION_MAX_S;
    0: none) whose logged steps refit the profile, then the plan's trace, repeats times; the simulated
    side again on the serving fit, and both fits' errors against the repeats pooled. With repeats > 1,
    each later repeat's error against the first (the real mesh predicting itself). fit_refits: the
    simulated side again on that many refits of the serving fit, each to a bootstrap resample of the
    calibration's steps, for the range the fit's own uncertainty spans. target_load: the plan's rates
    scaled first to offer this load (sim/fidelity_load.py; None: as the plan has them). The result is also
    written to out (and every request on both sides next to it)."""
    started = time.perf_counter()
    offline = calibrate()
    profile = cpu_profile(offline, CHAT_MODEL, EMBED_MODEL)
    turns = conversations(CONVERSATIONS)
    if target_load is not None:
        plan, _ = plan_for_load(target_load, plan, profile, turns)
    trace = make_trace(plan, turns)
    sim_served, sim = simulate(trace, profile, plan.seed, turns)
    sim_offline = matched_metrics(sim_served, trace.duration_s, repeats)
    result: dict[str, object] = {
        "window_s": trace.duration_s,
        "load_scale": load_scale_of(plan.workload),
        "target_offered_load": target_load,
        "seed": plan.seed,
        "requests": trace.requests(),
        "trace_totals": {wc.name.lower(): t for wc, t in trace.totals().items()},
        "offered_load": offered_load(sim),
        "sim_decode_steps": [round(e.counter) for e in sim.engines],  # steps that advanced decodes, per GPU
        "profile": {
            "name": profile.name,
            "token_budget": profile.token_budget,
            "max_running": profile.max_running,
            "preempt_granularity_s": profile.preempt_granularity_s,
            "calibration": offline["key"],
        },
        "sim": sim_offline,
    }
    if sim_only:
        return result
    window = calibration_window_s
    if window is None:
        window = min(plan.workload.duration_s, CALIBRATION_MAX_S)
    calibration_plan = replace(
        plan, seed=plan.seed + CALIBRATION_SEED_OFFSET, workload=replace(plan.workload, duration_s=window)
    )
    calibration_trace = make_trace(calibration_plan, turns) if window > 0 else None
    encoder = Path(str(offline["models"][EMBED_MODEL]["path"]))  # type: ignore[index]
    words = single_token_words(encoder / "tokenizer.json")
    with tempfile.TemporaryDirectory(prefix="sim-fidelity-steps-") as steps:
        real_runs, meta, calibration_served = serve_on_mesh(
            trace, plan.seed, words, Path(steps), calibration_trace, repeats
        )
        calibration_logs = logs_by_model(Path(steps) / "calibration")
        serving = serving_calibration(offline, calibration_logs) if calibration_trace is not None else offline
        # The same fit without the slowdown per request in flight: what that term changes, on this run.
        linear = None
        if serving is not offline:
            linear = serving_calibration(offline, calibration_logs, slowdown=False)
        refits = [
            serving_calibration(offline, calibration_logs, resample=np.random.default_rng([plan.seed, 30, k]))
            for k in range(fit_refits if calibration_trace is not None else 0)
        ]
        evaluation = Path(steps) / "evaluation"
        step_fit = {
            "offline": out_of_sample(offline, evaluation),
            "serving": out_of_sample(serving, evaluation),
        }
        # A diagnostic, never the headline: the same terms fitted to the evaluation's own steps (in
        # sample), which takes the machine's drift between the two windows out of the error.
        in_run = serving_calibration(offline, logs_by_model(evaluation))
        # Kept beside the result: bench/fidelity_waits.py reads them against the requests.
        shutil.rmtree(steps_dir(out), ignore_errors=True)
        shutil.copytree(steps, steps_dir(out))
    real = pooled_metrics(real_runs, trace.duration_s)
    real_served = [s for run in real_runs for s in run]
    errors_offline = relative_errors(real, sim_offline)
    serving_profile = cpu_profile(serving, CHAT_MODEL, EMBED_MODEL)
    calibration_unix = meta.get("calibration_started_unix")
    calibration_started = float(calibration_unix) if calibration_unix is not None else None  # type: ignore[arg-type]
    overhead_s, overhead_by = fitted_overhead_s(
        calibration_served, serving_profile, steps_dir(out) / "calibration", calibration_started
    )
    network = NetworkCosts(request_overhead_s=overhead_s)
    if serving is not offline:
        sim_served, _ = simulate(trace, serving_profile, plan.seed, turns, network)
    sim_serving = matched_metrics(sim_served, trace.duration_s, repeats)
    errors = relative_errors(real, sim_serving)
    errors_in_run = relative_errors(real, metrics_on(in_run, trace, plan.seed, turns, network, repeats))
    errors_linear = None
    if linear is not None:
        errors_linear = relative_errors(real, metrics_on(linear, trace, plan.seed, turns, network, repeats))
    fit_spread = _fit_spread(real, refits, trace, plan.seed, turns, network, repeats)
    repeats_real = [class_metrics(run, trace.duration_s) for run in real_runs]
    errors_between_repeats = [relative_errors(repeats_real[0], later) for later in repeats_real[1:]]
    result.update(
        sim=sim_serving,
        sim_offline=sim_offline,
        real=real,
        calibration={
            "source": "serving" if serving is not offline else "offline",
            "trace_seed": calibration_plan.seed,
            "trace_window_s": window,
            "request_overhead_s": overhead_s,
            "request_overhead_measured": overhead_by,
            "coefficients": {m: serving["models"][m]["coefficients"] for m in (CHAT_MODEL, EMBED_MODEL)},  # type: ignore[index]
            "host_slowdown_per_request": serving_profile.host_slowdown_per_request,
            "encoder_core_share": serving_profile.encoder_core_share,
            "offline_coefficients": {
                m: offline["models"][m]["coefficients"]
                for m in (CHAT_MODEL, EMBED_MODEL)  # type: ignore[index]
            },
            "evaluation_steps": step_fit,
        },
        errors=errors,
        errors_offline=errors_offline,
        fidelity_ttft_p99_error=headline(errors, "ttft_p99_s"),
        fidelity_ttft_p50_error=headline(errors, "ttft_p50_s"),
        fidelity_throughput_error=headline(errors, "throughput"),
        offline_fidelity={m: headline(errors_offline, m) for m in ("ttft_p50_s", "ttft_p99_s", "throughput")},
        weighted_errors={m: weighted(errors, real, m) for m in ("ttft_p50_s", "ttft_p99_s", "throughput")},
        aggregation="max over classes (weighted: request-weighted mean)",
        repeats=repeats,
        real_repeats=repeats_real,
        # Each later repeat's error against the first: the real mesh's own noise on the same measure.
        errors_between_repeats=errors_between_repeats,
        between_repeats={m: _worst(errors_between_repeats, m) for m in METRICS},
        # The step costs fitted in sample to the evaluation's own logged steps: what is left is the
        # simulator's model of serving, not the machine's drift since the calibration trace.
        in_run_fit={
            "errors": errors_in_run,
            **headlines(errors_in_run),
            "coefficients": {m: in_run["models"][m]["coefficients"] for m in (CHAT_MODEL, EMBED_MODEL)},  # type: ignore[index]
        },
        # Sequences preempted (KV dropped, recomputed later), by class: the real engines' counter over
        # one repeat on average, and the simulated engines' on the one pass.
        preemptions={
            "real_per_repeat": {c: n / repeats for c, n in meta["preemptions"].items()},  # type: ignore[attr-defined]
            "sim": preemptions_by_class(sim_served),
        },
        # Each class's requests per worker: where the placer sent them in each real repeat and in the
        # simulation (the same code, deciding on what each side's timing shows it).
        routing={
            "real_repeats": [routing_shares(run) for run in real_runs],
            "sim": routing_shares(sim_served),
        },
        # The serving fit without the slowdown per request in flight (sim/host_contention.py), as scored.
        without_slowdown=None
        if errors_linear is None
        else {
            "errors": errors_linear,
            **headlines(errors_linear),
        },
        fit_spread=fit_spread,
        target=TARGET,
        mesh=meta,
        failed_real=sum(1 for s in real_served if s.status != "OK"),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
        bench_seconds=time.perf_counter() - started,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    # Every request on both sides, for looking into where the two part.
    detail = {
        "real": [{**row_of(r), "repeat": k} for k, run in enumerate(real_runs) for r in run],
        "sim": [row_of(r) for r in sim_served],
        "calibration_real": [row_of(r) for r in calibration_served],
    }
    requests_path(out).write_text(json.dumps(detail))
    return result


def _fit_spread(
    real: dict[str, dict[str, float | int | None]],
    refits: list[dict[str, object]],
    trace: Trace,
    seed: int,
    turns: list[Conversation],
    network: NetworkCosts,
    repeats: int,
) -> dict[str, object] | None:
    """The simulated figures' range over the refits of the step costs (each to a bootstrap resample of the
    calibration's steps), and how far outside it each real figure lies (0: inside); None without refits.
    repeats: the real side's, which each simulated pass is pooled to match (matched_metrics)."""
    if not refits:
        return None
    runs = [metrics_on(refit, trace, seed, turns, network, repeats) for refit in refits]
    ranges = metric_ranges(runs)
    outside = outside_range(real, ranges)
    return {
        "refits": len(runs),
        "ranges": ranges,
        "real_outside": outside,
        **{f"worst_{m}": headline(outside, m) for m in METRICS},
    }


def _refusal(args: argparse.Namespace) -> str | None:
    """Why args cannot be run as given (a count, window or load it cannot serve, or one it would ignore);
    None when they can."""
    load_given = args.load_scale is not None or args.offered_load is not None
    if args.resimulate and (args.repeats != 1 or args.seconds is not None or load_given):
        return (
            "--resimulate reuses the last run's trace, load and repeats: "
            "drop --seconds, --offered-load, --load-scale and --repeats"
        )
    if args.repeats < 1:
        return f"--repeats must be at least 1, got {args.repeats}"
    if args.seconds is not None and not args.seconds > 0:
        return f"--seconds must be positive, got {args.seconds}"
    if args.offered_load is not None and args.load_scale is not None:
        return "give --offered-load or --load-scale, not both"
    for flag, value in (("--offered-load", args.offered_load), ("--load-scale", args.load_scale)):
        if value is not None and not value > 0:
            return f"{flag} must be positive, got {value}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    refusal = _refusal(args)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return 2
    if args.resimulate:
        print(json.dumps(resimulate(OUT_QUICK if args.quick else OUT, conversations(CONVERSATIONS))))
        return 0
    plan = replace(QUICK if args.quick else FULL, seed=args.seed)
    if args.seconds is not None:
        plan = replace(plan, workload=replace(plan.workload, duration_s=args.seconds))
    target_load = args.offered_load if args.offered_load is not None else DEFAULT_OFFERED_LOAD
    if args.load_scale is not None:  # a rate asked for: the load is whatever it offers this machine
        plan = replace(plan, workload=mesh_workload(plan.workload.duration_s, args.load_scale))
        target_load = None
    result = run_fidelity(
        plan,
        args.sim_only,
        OUT_QUICK if args.quick else OUT,
        repeats=args.repeats,
        fit_refits=args.fit_refits,
        target_load=target_load,
    )
    print(json.dumps({**result, "quick": args.quick}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
