"""bench/sim_fidelity.py --resimulate: the simulator's side of a saved run again, on that run's serving
calibration, against its real side, for changes to the simulator between mesh runs."""

from __future__ import annotations

import json
from pathlib import Path

from bench.fidelity_records import fitted_overhead_s, requests_path, row_of, served_of
from bench.fidelity_steps import steps_dir
from sim.calibrate import calibrate
from sim.cpu_profile import cpu_profile
from sim.fidelity import (
    CHAT_MODEL,
    EMBED_MODEL,
    FidelityPlan,
    headline,
    headlines,
    make_trace,
    matched_metrics,
    mesh_workload,
    metrics_on,
    preemptions_by_class,
    relative_errors,
    routing_shares,
    simulate,
)
from sim.fleet import NetworkCosts
from sim.serving_fit import logs_by_model, serving_calibration
from sim.sharegpt import Conversation


def resimulate(last: Path, turns: list[Conversation]) -> dict[str, object]:
    """The simulator's side of the run saved in last (its trace built from turns, as the run built it),
    again, on that run's serving calibration (its step costs and request overhead, fitted by the current
    rules to its calibration trace's steps and requests where the run kept them, else as it recorded
    them) against its real side. Written next to last, which stays as it was."""
    run = json.loads(last.read_text())
    offline = calibrate()
    fitted = run["calibration"]
    logged = steps_dir(last) / "calibration"
    if any(logged.glob("*.jsonl")):  # refitted by the current rule to that run's calibration steps
        serving = serving_calibration(offline, logs_by_model(logged))
        linear = serving_calibration(offline, logs_by_model(logged), slowdown=False)
    else:
        # As the run recorded its fit (runs before the encoder's serving fit recorded its offline one).
        serving = json.loads(json.dumps(offline))
        for model, coefficients in fitted["coefficients"].items():
            serving["models"][model]["coefficients"] = coefficients
        if "host_slowdown_per_request" in fitted:
            serving["models"][CHAT_MODEL]["host_slowdown_per_request"] = fitted["host_slowdown_per_request"]
        if "encoder_core_share" in fitted:
            serving["models"][EMBED_MODEL]["encoder_core_share"] = fitted["encoder_core_share"]
        linear = None
    plan = FidelityPlan(mesh_workload(run["window_s"], run.get("load_scale", 1.0)), seed=run["seed"])
    trace = make_trace(plan, turns)
    profile = cpu_profile(serving, CHAT_MODEL, EMBED_MODEL)
    overhead_s, overhead_by = fitted["request_overhead_s"], "as recorded"
    requests = requests_path(last)
    if requests.exists():  # measured again by the current rule on that run's calibration requests
        served = [served_of(row) for row in json.loads(requests.read_text())["calibration_real"]]
        started = run.get("mesh", {}).get("calibration_started_unix")
        overhead_s, overhead_by = fitted_overhead_s(served, profile, logged, started)
    network = NetworkCosts(request_overhead_s=overhead_s)
    sim_served, _ = simulate(trace, profile, plan.seed, turns, network)
    repeats = int(run.get("repeats", 1))
    sim_metrics = matched_metrics(sim_served, trace.duration_s, repeats)
    errors = relative_errors(run["real"], sim_metrics)
    without_slowdown = None
    if linear is not None:
        without_slowdown = headlines(
            relative_errors(run["real"], metrics_on(linear, trace, plan.seed, turns, network, repeats))
        )
    result = {
        "resimulated_from": str(last),
        "measured_at": run["measured_at"],
        "request_overhead_s": overhead_s,
        "request_overhead_measured": overhead_by,
        "host_slowdown_per_request": profile.host_slowdown_per_request,
        "sim": sim_metrics,
        "errors": errors,
        "fidelity_ttft_p99_error": headline(errors, "ttft_p99_s"),
        "fidelity_ttft_p50_error": headline(errors, "ttft_p50_s"),
        "fidelity_throughput_error": headline(errors, "throughput"),
        "preemptions": {
            "real_per_repeat": run.get("preemptions", {}).get("real_per_repeat"),
            "sim": preemptions_by_class(sim_served),
        },
        "without_slowdown": without_slowdown,
        "routing": {
            "real_repeats": run.get("routing", {}).get("real_repeats"),
            "sim": routing_shares(sim_served),
        },
    }
    last.with_name(last.stem + "_resimulated.json").write_text(json.dumps(result))
    rows = [row_of(r) for r in sim_served]
    last.with_name(last.stem + "_resimulated_requests.json").write_text(json.dumps(rows))
    return result
