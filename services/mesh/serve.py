"""`hanzo-mesh serve MODEL...`: what the models are called and where they are, and the lines a user needs
to reach the mesh (gRPC address, OpenAI base URL, API key)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from services.mesh.models import ModelSet
from services.mesh.service_env import service_env

NAMED = ("smollm2", "minilm")  # models that ship in Python packages, served by name


def add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and engine options of `serve`, named as vLLM's server names them."""
    parser.add_argument(
        "models", nargs="+", metavar="MODEL",
        help=f"a Hugging Face checkpoint directory, a .gguf file, or one of: {', '.join(NAMED)}",
    )  # fmt: skip
    parser.add_argument(
        "--name", action="append", default=[], metavar="NAME",
        help="the name a MODEL is served under, once per MODEL in order (default: the directory's or "
        "file's name, or the model's own name)",
    )  # fmt: skip
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    parser.add_argument(
        "--max-model-len", type=_at_least(2, int), help="context length (default: the model's)"
    )
    parser.add_argument(
        "--max-num-seqs", type=_at_least(1, int), help="sequences a model runs at once (default 64)"
    )
    parser.add_argument(
        "--kv-cache-gib", type=_at_least(0.001, float), help="KV pool per model in GiB (default 2)"
    )


def serving_models(models: Sequence[str], names: Sequence[str]) -> ModelSet:
    """Every MODEL resolved to a path under its served name; ValueError with a message a person can act
    on for a MODEL that is neither a checkpoint nor a known name, or names that do not match up."""
    # Imported here: `hanzo-mesh --help` should not import torch.
    from services.worker.models.catalog import resolve_model_source
    from services.worker.models.errors import CheckpointError
    from services.worker.models.synthetic import minilm_path

    if names and len(names) != len(models):
        raise ValueError(f"--name was given {len(names)} times for {len(models)} models: give one per MODEL")
    paths: dict[str, Path] = {}
    for i, model in enumerate(models):
        try:
            path = (minilm_path() if model == "minilm" else resolve_model_source(model)).resolve()
        except CheckpointError as err:
            raise ValueError(str(err)) from None
        name = names[i] if names else _default_name(model, path)
        if name in paths:
            raise ValueError(f"two models would be served as {name!r}: name them apart with --name")
        paths[name] = path
    return ModelSet(paths)


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """HANZO_WORKER_* settings from the serving options (only those given)."""
    kv_bytes = None if args.kv_cache_gib is None else int(args.kv_cache_gib * 1024**3)
    return service_env(
        "worker", dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        kv_cache_bytes=kv_bytes,
    )  # fmt: skip


def access_lines(gateway_address: str, http_address: str, api_key: str, prometheus_url: str = "") -> str:
    """What a client needs: the gRPC address, the OpenAI base URL, the local Prometheus where one runs,
    and the key (one per line, the key last)."""
    lines = [f"gateway: {gateway_address}  (metadata authorization: Bearer {api_key})"]
    if http_address:
        lines.append(f"openai: http://{http_address}/v1  (Authorization: Bearer {api_key})")
    if prometheus_url:
        lines.append(f"prometheus: {prometheus_url}  (dashboard: deploy/grafana/dashboards/hanzo-mesh.json)")
    lines.append(f"api key: {api_key}")
    return "\n".join(lines)


def _at_least(low: float, kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def _default_name(model: str, path: Path) -> str:
    if model in NAMED:
        return model
    return path.stem if path.is_file() else path.name
