"""Where an engine's model comes from, shared by the decoder and the embedding engine: a checkpoint
loaded on its own, a checkpoint built into a new partition of a memory arena, or the host copy an
earlier engine's evict() returned, rebuilt in an arena with one bulk copy.

The model's config is checked (decoder or encoder) before anything is reserved, so the wrong kind of
model never takes a partition; in an arena the partition is sized with the KV bytes the engine plans
from that config (0 for an encoder)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import torch

from services.worker.memory.host_copy import HostCopy
from services.worker.memory.manager import MemoryManager
from services.worker.memory.placement import PlacedModel, load_from_host_copy, load_into_partition
from services.worker.models.catalog import default_model_name
from services.worker.models.config import load_model_config
from services.worker.models.config_types import DecoderConfig, EncoderConfig
from services.worker.models.loader import LoadedModel, load_model, parse_dtype

C = TypeVar("C", DecoderConfig, EncoderConfig)
# The model's config if it is the kind the engine serves; raises InvalidRequestError naming the source.
CheckConfig = Callable[[DecoderConfig | EncoderConfig, str | Path], C]


@dataclass(frozen=True)
class ModelPlacement(Generic[C]):
    """loaded: the model and tokenizer; placed: its partition in the arena (None alone); name: the
    model's name in the arena (None alone, unless given)."""

    loaded: LoadedModel
    config: C
    placed: PlacedModel | None
    name: str | None


def place_model(
    source: str | Path | HostCopy,
    check: CheckConfig[C],
    *,
    dtype: str,
    device: torch.device,
    memory: MemoryManager | None = None,
    model_name: str | None = None,
    kv_bytes: Callable[[C], int] = lambda config: 0,
) -> ModelPlacement[C]:
    """The model of source, alone (memory None) or in a new partition of memory's arena named
    model_name (None: the checkpoint's name, or the name the host copy was evicted under) with a KV
    pool of kv_bytes(config). ValueError for a host copy without an arena, or one of another dtype, or
    an arena on another device; the memory manager's errors (nothing reserved then)."""
    if memory is None:
        if isinstance(source, HostCopy):
            raise ValueError("a model is rebuilt from a host copy only in an arena; pass memory=")
        loaded = load_model(source, dtype=dtype, device=device)
        return ModelPlacement(loaded, check(loaded.config, source), None, model_name)
    if memory.arena.device != device:
        raise ValueError(f"the engine runs on {device} but the arena is on {memory.arena.device}")
    if isinstance(source, HostCopy):
        if source.dtype != parse_dtype(dtype):
            raise ValueError(f"the host copy holds {source.dtype}, the engine is configured for {dtype}")
        name = model_name or source.model
        config = check(source.config, source.model_dir)
        placed = load_from_host_copy(memory, name, source, kv_bytes(config))
    else:
        name = model_name or default_model_name(source)
        config = check(load_model_config(Path(source)), source)
        placed = load_into_partition(memory, name, source, dtype, kv_bytes(config))
    return ModelPlacement(placed.loaded, config, placed, name)
