"""Online serving benchmark in the manner of vLLM's benchmark_serving: the mesh against vLLM's own OpenAI
server, same checkpoint (SmolLM2-135M-Instruct), same ShareGPT requests, same Poisson load.

Each server runs alone (never two at once: the box has 2 cores). Per server: an untimed warm-up, the
saturation load (every request at once, "inf") first, then each Poisson rate; with --grpc the mesh also
takes the saturation load over the gateway's gRPC Inference.Chat. The Poisson rates are fractions of
vLLM's measured capacity (saturation requests/s); the moderate rate, TTFT's headline, is half of it.
Progress on stderr, one JSON line on stdout.

    .venv/bin/python bench/serving.py --vllm-python /work/vllm-venv/bin/python --grpc [--quick]
    .venv/bin/python bench/serving.py --mesh-url http://127.0.0.1:8000/v1 --mesh-key KEY   # already up
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `services` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.progress import log
from bench.serving_client import GrpcChat, HttpChat, StreamFn, grpc_model, http_model, run_load, warm_up
from bench.serving_data import MAX_OUTPUT_TOKENS, ChatRequest, sample_requests
from bench.serving_model import DEFAULT_MODEL_DIR, ensure_model, measured_dtype
from bench.serving_servers import Endpoint, ServerOptions, mesh_server, vllm_server
from bench.serving_stats import TARGETS, comparisons, headline, rate_key, run_summary

LOG_DIR = Path(".cache/bench/serving-logs")
WARM_UP_REQUESTS = 2
# The x-hanzo-workload names the gateway accepts (services.common.workload.WorkloadClass, lower case).
SATURATION_CLASSES = ("realtime_chat", "agent_tool", "batch")
Runs = dict[str, dict[str, object]]  # a server's load summaries by rate key ("inf", "0.75", ...)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8 short requests, saturation + moderate (<5 min)")
    p.add_argument("--num-prompts", type=int, help="requests per load (default 100; quick 8)")
    p.add_argument("--rates", default="", help="Poisson rates in requests/s, comma-separated (default none)")
    p.add_argument(
        "--rate-fractions",
        help="Poisson rates as fractions of the first server's capacity (default 0.5,0.9; quick 0.5)",
    )
    p.add_argument("--moderate-rate", default="auto", help="TTFT headline's rate; auto: half the capacity")
    p.add_argument("--max-output-tokens", type=int, help="cap on a reply's length (default 128; quick 48)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--saturation-class", default="batch", choices=("auto", *SATURATION_CLASSES),
        help="x-hanzo-workload of the all-at-once loads (default batch: bulk work; auto: the gateway "
        "classifies, and a realtime chat not scheduled within its 5 s queue timeout is refused with 429)",
    )  # fmt: skip
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument(
        "--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
        help="both servers' dtype; auto: the one the worker's dtype auto measures faster here, by name",
    )  # fmt: skip
    p.add_argument("--kv-gib", type=float, default=2.0, help="KV cache budget of each server, GiB")
    p.add_argument("--vllm-python", type=Path, help="interpreter of a vLLM virtualenv; none: no vLLM run")
    p.add_argument(
        "--vllm-env", action="append", default=[], metavar="KEY=VALUE",
        help="extra environment for vLLM, e.g. VLLM_CPU_OMP_THREADS_BIND=0-1 (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--vllm-arg", action="append", default=[], metavar="ARG",
        help="extra vLLM server argument, e.g. --vllm-arg=--max-num-seqs=64 (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--vllm-eager", action="store_true",
        help="vLLM without torch.compile (quick's default: this vLLM compiles at every start, minutes)",
    )  # fmt: skip
    p.add_argument("--no-mesh", action="store_true", help="measure vLLM only")
    p.add_argument("--mesh-url", help="OpenAI base URL of a mesh already running (instead of starting one)")
    p.add_argument("--mesh-key", default="", help="its API key")
    p.add_argument("--mesh-grpc", help="its gateway's gRPC address (for --grpc)")
    p.add_argument("--grpc", action="store_true", help="saturation over gRPC Inference.Chat too")
    p.add_argument("--run-timeout-s", type=float, help="bound on one load (default 1800; quick 150)")
    p.add_argument("--start-timeout-s", type=float, default=600.0, help="bound on a server's start")
    args = p.parse_args(argv)
    args.num_prompts = args.num_prompts or (8 if args.quick else 100)
    args.max_output_tokens = args.max_output_tokens or (48 if args.quick else MAX_OUTPUT_TOKENS)
    args.vllm_eager = args.vllm_eager or args.quick
    args.run_timeout_s = args.run_timeout_s or (150.0 if args.quick else 1800.0)
    if args.rate_fractions is None:
        args.rate_fractions = "0.5" if args.quick else "0.5,0.9"
    try:
        args.plan = RatePlan(
            absolute=_numbers(args.rates),
            fractions=_numbers(args.rate_fractions),
            fixed_moderate=None if args.moderate_rate == "auto" else float(args.moderate_rate),
        )
    except ValueError as err:
        p.error(str(err))
    if any("=" not in e for e in args.vllm_env):
        p.error("--vllm-env takes KEY=VALUE")
    if args.no_mesh and not args.vllm_python:
        p.error("--no-mesh needs --vllm-python")
    return args


def _numbers(text: str) -> list[float]:
    values = [float(v) for v in text.split(",") if v.strip()]
    if any(v <= 0 for v in values):
        raise ValueError(f"rates must be positive: {text}")
    return values


@dataclass
class RatePlan:
    """The Poisson rates both servers run, settled once from the saturation requests/s (capacity) of the
    first server measured (vLLM when it runs: it goes first), so both take identical loads: the
    absolute rates, the fractions of that capacity, and the moderate rate (TTFT's headline; half the
    capacity unless fixed)."""

    absolute: list[float]
    fractions: list[float]
    fixed_moderate: float | None
    capacity: float | None = None
    moderate: float | None = None
    rates: list[float] | None = None

    @property
    def moderate_key(self) -> str | None:
        return rate_key(self.moderate) if self.moderate else None

    def after_saturation(self, runs: Runs) -> list[float]:
        if self.rates is None:
            cap = runs.get("inf", {}).get("requests_s")
            self.capacity = float(cap) if isinstance(cap, (int, float)) and cap > 0 else None
            relative = [round(f * self.capacity, 3) for f in self.fractions] if self.capacity else []
            half = round(self.capacity / 2, 3) if self.capacity else None
            self.moderate = self.fixed_moderate if self.fixed_moderate is not None else half
            self.rates = sorted({*self.absolute, *relative, *([self.moderate] if self.moderate else [])})
        return self.rates


@dataclass(frozen=True)
class Samples:
    """Disjoint ShareGPT samples, one per load. A server's prefix cache keeps the prompts it has served,
    so a load repeating an earlier load's prompts would skip most of their prefill (measured: 64 requests'
    first tokens 2.9 s cold, 1.35 s on a second pass). Both servers take the same sample at a rate."""

    warm: list[ChatRequest]
    saturation: list[ChatRequest]
    poisson: list[list[ChatRequest]]  # by the rate's place in the sorted plan
    spare: list[ChatRequest]  # the gRPC pass on a mesh this run did not start (it cannot be restarted)

    @classmethod
    def draw(cls, model_dir: Path, args: argparse.Namespace, path: Path | None = None) -> Samples:
        """Enough requests for every load the plan can run; path: the dataset (default the package's)."""
        plan: RatePlan = args.plan
        poisson_loads = len(plan.absolute) + len(plan.fractions) + 1  # the moderate rate may be extra
        n, warm = args.num_prompts, WARM_UP_REQUESTS
        pool = sample_requests(
            model_dir, warm + n * (poisson_loads + 2), args.seed, args.max_output_tokens, path=path
        )
        blocks = [pool[warm + i * n : warm + (i + 1) * n] for i in range(poisson_loads + 2)]
        return cls(pool[:warm], blocks[0], blocks[1:-1], blocks[-1])

    def at_rate(self, rates: Sequence[float], rate: float) -> list[ChatRequest]:
        return self.poisson[sorted(rates).index(rate)]


def measure(endpoint: Endpoint, samples: Samples, args: argparse.Namespace) -> Runs:
    """Over HTTP: warm-up, saturation (as the --saturation-class workload), then the Poisson rates (chosen
    once saturation is known, classified by the gateway). Returns the runs by rate key."""

    async def go() -> Runs:
        model = await http_model(endpoint)
        bulk = HttpChat(endpoint.base_url, endpoint.api_key, model, saturation_workload(args))
        http = HttpChat(endpoint.base_url, endpoint.api_key, model)
        runs: Runs = {}
        try:
            await warm_up(http, samples.warm, endpoint.name, count=len(samples.warm))
            runs["inf"] = await timed(endpoint.name, bulk, samples.saturation, float("inf"), args)
            rates = args.plan.after_saturation(runs)
            for rate in rates:
                runs[rate_key(rate)] = await timed(
                    endpoint.name, http, samples.at_rate(rates, rate), rate, args
                )
        finally:
            await http.close()
            await bulk.close()
        return runs

    return asyncio.run(go())


def measure_grpc(
    endpoint: Endpoint, samples: Samples, requests: list[ChatRequest], args: argparse.Namespace
) -> Runs:
    """Saturation over the gateway's gRPC Inference.Chat after a warm-up, as the same class as over HTTP."""

    async def go() -> Runs:
        if not endpoint.grpc_address:
            log("--grpc: no gateway address (serve printed no `gateway:` line; give --mesh-grpc)")
            return {}
        model = await grpc_model(endpoint)
        chat = GrpcChat(endpoint.grpc_address, endpoint.api_key, model)
        bulk = GrpcChat(endpoint.grpc_address, endpoint.api_key, model, saturation_workload(args))
        try:
            await warm_up(chat, samples.warm, "mesh gRPC", count=len(samples.warm))
            return {"inf": await timed("mesh gRPC", bulk, requests, float("inf"), args)}
        finally:
            await chat.close()
            await bulk.close()

    return asyncio.run(go())


def saturation_workload(args: argparse.Namespace) -> str | None:
    return None if args.saturation_class == "auto" else args.saturation_class


async def timed(
    name: str, stream: StreamFn, requests: Sequence[ChatRequest], rate: float, args: argparse.Namespace
) -> dict[str, object]:
    log(f"{name}: {len(requests)} requests at rate {rate_key(rate)}")
    result = await run_load(stream, requests, rate, args.seed, args.run_timeout_s)
    summary = run_summary(result, requests)
    log(
        f"{name} rate {rate_key(rate)}: {summary['out_tok_s']} out tok/s, {summary['requests_s']} req/s, "
        f"TTFT p50/p99 {summary['ttft_ms_p50']}/{summary['ttft_ms_p99']} ms, "
        f"TPOT p50 {summary['tpot_ms_p50']} ms, "
        f"errors {summary['errors']}, wrong counts {summary['wrong_token_counts']}"
    )
    return summary


@contextlib.contextmanager
def mesh_endpoint(args: argparse.Namespace) -> Iterator[Endpoint]:
    if args.mesh_url:
        yield Endpoint("mesh", args.mesh_url.rstrip("/"), args.mesh_key, args.mesh_grpc)
        return
    with mesh_server(server_options(args)) as ep:
        yield ep


def server_options(args: argparse.Namespace) -> ServerOptions:
    # Absolute paths: the servers run from the repository root, whatever directory this started in.
    model_dir, log_dir = args.model_dir.resolve(), LOG_DIR.resolve()
    return ServerOptions(
        model_dir, args.max_model_len, args.dtype, args.kv_gib, log_dir, args.start_timeout_s
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the `with` blocks stop whatever server is running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    model_dir = ensure_model(args.model_dir)
    if args.dtype == "auto":
        args.dtype = measured_dtype(model_dir)
        log(f"dtype auto measures {args.dtype} faster on this machine: both servers run it")
    samples = Samples.draw(model_dir, args)
    requests = samples.saturation
    log(
        f"{len(requests)} ShareGPT requests per load ({1 + len(samples.poisson)} loads of disjoint samples), "
        f"{sum(r.max_tokens for r in requests)} output tokens at saturation"
    )
    report: dict[str, object] = {"bench": "serving", "model": "SmolLM2-135M-Instruct (GGUF Q4_1, unpacked)"}
    plan: RatePlan = args.plan
    if args.vllm_python:
        extra_env = dict(e.split("=", 1) for e in args.vllm_env)
        vllm_args = [*args.vllm_arg, *(["--enforce-eager"] if args.vllm_eager else [])]
        with vllm_server(args.vllm_python, server_options(args), extra_env, vllm_args) as endpoint:
            vllm_runs = measure(endpoint, samples, args)
        report["vllm_info"] = endpoint.info
        report.update(headline("vllm", vllm_runs, plan.moderate_key))
        report["vllm"] = vllm_runs
    if not args.no_mesh:
        grpc_runs: Runs = {}
        with mesh_endpoint(args) as endpoint:
            mesh_runs = measure(endpoint, samples, args)
            if args.grpc and args.mesh_url:  # not ours to restart: a sample its cache has not seen
                grpc_runs = measure_grpc(endpoint, samples, samples.spare, args)
        if args.grpc and not args.mesh_url:
            # A fresh mesh for the gRPC pass, so it runs the HTTP saturation's very prompts, uncached.
            with mesh_endpoint(args) as endpoint:
                grpc_runs = measure_grpc(endpoint, samples, requests, args)
        report.update(headline("mesh", mesh_runs, plan.moderate_key))
        report["mesh"] = mesh_runs
        if grpc_runs:
            report["grpc_out_tok_s"] = grpc_runs["inf"].get("out_tok_s")
            report["grpc"] = grpc_runs
    report.update(comparisons(report))
    report["moderate_rate"] = plan.moderate
    report["capacity_requests_s"] = plan.capacity  # the first server's, which the rates derive from
    report["rates"] = plan.rates
    report["targets"] = TARGETS
    report["sample"] = {
        "requests": len(requests),
        "prompt_tokens_mean": round(statistics.mean(r.prompt_tokens for r in requests), 1),
        "max_tokens_mean": round(statistics.mean(r.max_tokens for r in requests), 1),
    }
    report["settings"] = {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "plan"
    }
    report["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
