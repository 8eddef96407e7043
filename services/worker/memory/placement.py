"""Building a model inside a partition of the arena: every parameter and buffer a view of its weights slot."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from torch import nn

from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena
from services.worker.memory.errors import ModelAlreadyResidentError
from services.worker.memory.manager import MemoryManager
from services.worker.memory.partition import Partition
from services.worker.memory.weights import TensorSpec, WeightLayout, layout_tensors
from services.worker.models.loader import LoadedModel, load_model

# Each tensor in a weights slot starts on a multiple of this: what CUDA kernels' vector loads want, and
# the padding is negligible next to a model's tensors.
TENSOR_ALIGNMENT = 256


def module_tensor_specs(model: nn.Module) -> list[TensorSpec]:
    """One spec per distinct parameter and buffer of model (built on meta, already in its load dtype), in
    module order; a tied tensor (e.g. the LM head sharing the embedding) counts once, under its first name."""
    named = itertools.chain(model.named_parameters(), model.named_buffers())
    return [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in named]


def bind_to_arena(model: nn.Module, arena: Arena, layout: WeightLayout, slot: ByteRange) -> None:
    """Point every parameter and buffer of model at its range of slot (laid out by layout from
    module_tensor_specs(model)) in arena. Tied parameters share one view; contents are left as they are."""
    names = {id(t): name for name, t in itertools.chain(model.named_parameters(), model.named_buffers())}

    def view_of(tensor: torch.Tensor) -> torch.Tensor:
        spec = layout.specs[names[id(tensor)]]
        return arena.view(layout.place(slot, spec.name), spec.dtype, spec.shape)

    bound: dict[int, nn.Parameter] = {}  # id of the meta parameter -> its arena-backed replacement
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in bound:
                bound[id(param)] = nn.Parameter(view_of(param), requires_grad=param.requires_grad)
            setattr(module, name, bound[id(param)])
        for name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, name, view_of(buffer))


def load_into_partition(
    memory: MemoryManager,
    model_name: str,
    model_dir: str | Path,
    dtype: torch.dtype | str,
    kv_bytes: int,
) -> tuple[LoadedModel, Partition]:
    """Load model_dir in dtype into a new partition of memory named model_name: a weights slot sized from
    the model built on meta (parameters and buffers, tied tensors once) holding every tensor as an arena
    view, and a KV pool of kv_bytes (>= 0; 0: none) left for the caller to lay out. The model becomes the
    most recently used. OutOfMemoryError if it does not fit, ModelAlreadyResidentError if the name is
    resident, CheckpointError for a bad checkpoint (the partition is released again on any failure)."""
    if model_name in memory:
        raise ModelAlreadyResidentError(model_name)
    placed: list[Partition] = []

    def materialize(model: nn.Module) -> None:
        layout = layout_tensors(module_tensor_specs(model), TENSOR_ALIGNMENT)
        placed.append(memory.reserve(model_name, layout.total_bytes, kv_bytes))
        bind_to_arena(model, memory.arena, layout, placed[0].weights)

    try:
        loaded = load_model(model_dir, dtype=dtype, device=memory.arena.device, materialize=materialize)
    except BaseException:
        if placed:
            memory.release(model_name)
        raise
    return loaded, placed[0]
