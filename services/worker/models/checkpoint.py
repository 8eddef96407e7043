"""Reading safetensors checkpoints lazily, and the checks every model's load_weights shares."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from services.worker.models.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Buffers older exporters saved that carry no learned state: we recompute them, so they are skipped.
HARMLESS_SUFFIXES = ("rotary_emb.inv_freq", "position_ids")


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files in load order: the index's shards, else model.safetensors,
    else every *.safetensors file (sorted). CheckpointError if there are none or a listed shard is gone."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(model_dir, "model directory does not exist")
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = list(dict.fromkeys(weight_map.values()))  # first-seen order, no duplicates
        # JSON and Unicode decode errors are ValueErrors; a wrong shape of JSON gives the other three.
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(index, f"not a valid index (needs a 'weight_map' object): {err}") from err
        files = [model_dir / str(name) for name in shards]
        for file in files:
            if not file.is_file():
                raise CheckpointError(file, f"shard listed in {INDEX_FILE} is missing")
        return files
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(model_dir, f"no *.safetensors file (expected {SINGLE_FILE} or {INDEX_FILE})")
    return files


def iter_safetensors(model_dir: Path) -> Iterator[tuple[str, str, torch.Tensor]]:
    """Yield (file path, tensor name, CPU tensor) one tensor at a time, so peak host memory is one
    tensor, not the checkpoint. CheckpointError naming the file if one is unreadable or corrupt."""
    for file in safetensors_files(model_dir):
        try:
            handle = safe_open(str(file), framework="pt", device="cpu")
        except Exception as err:  # safetensors raises its own error type, or OSError, for bad files
            raise CheckpointError(file, f"unreadable safetensors file ({err})") from err
        with handle:  # closes the file (and its mmap) even if the consumer stops early
            for name in handle.keys():  # noqa: SIM118 - a safe_open handle is not a dict
                try:
                    tensor = handle.get_tensor(name)
                except Exception as err:
                    raise CheckpointError(file, f"cannot read tensor {name!r} ({err})") from err
                yield str(file), name, tensor


def check_shape(file: str, name: str, tensor: torch.Tensor, expected_shape: Iterable[int]) -> None:
    """Raise CheckpointError(file) if tensor's shape is not expected_shape."""
    expected = list(expected_shape)
    if list(tensor.shape) != expected:
        raise CheckpointError(file, f"tensor {name!r} has shape {list(tensor.shape)}, expected {expected}")


def require_all(model_dir: Path, expected: set[str], seen: set[str]) -> None:
    """Raise CheckpointError(model_dir) naming the first (sorted) expected tensor that was not seen.
    model_dir: the checkpoint directory, or the .gguf file the tensors came from."""
    missing = sorted(expected - seen)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        where = "the GGUF file" if Path(model_dir).suffix.lower() == ".gguf" else "any *.safetensors file"
        problem = f"missing tensor {missing[0]!r}{more} (not in {where})"
        raise CheckpointError(model_dir, problem)


def reject_unexpected(file: str, name: str, ignored_prefixes: tuple[str, ...] = ()) -> None:
    """Return if a tensor the model has no use for is harmless (a recomputed buffer, or one of the
    model's ignored_prefixes such as a BERT pooler); else CheckpointError, since an unknown tensor
    usually means the checkpoint is a different architecture than config.json claims."""
    if name.endswith(HARMLESS_SUFFIXES) or name.startswith(ignored_prefixes):
        return
    raise CheckpointError(file, f"unexpected tensor {name!r} (does config.json name the right architecture?)")


def check_duplicate(file: str, name: str, seen: set[str]) -> None:
    """Raise CheckpointError(file) if name was already loaded from an earlier file; else record it."""
    if name in seen:
        raise CheckpointError(file, f"tensor {name!r} appears in more than one safetensors file")
    seen.add(name)
