"""Building a model inside a partition of the arena (every parameter and buffer a view of its weights
slot), from its checkpoint or from the host copy kept when it was evicted; and evicting it again."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena
from services.worker.memory.errors import HostCopyMismatchError, ModelAlreadyResidentError
from services.worker.memory.host_copy import HostCopy, copy_host_to_slot, copy_slot_to_host
from services.worker.memory.manager import MemoryManager
from services.worker.memory.partition import Partition
from services.worker.memory.weights import TensorSpec, WeightLayout, layout_tensors
from services.worker.models.loader import LoadedModel, build_on_meta, load_model
from services.worker.models.weight_order import column_major_on

# Each tensor in a weights slot starts on a multiple of this: what CUDA kernels' vector loads want, and
# the padding is negligible next to a model's tensors.
TENSOR_ALIGNMENT = 256


@dataclass(frozen=True)
class PlacedModel:
    """A model built in a partition: the model, the partition it was reserved, and where each of its
    tensors sits in the weights slot (what evict_to_host copies and a reload binds again)."""

    loaded: LoadedModel
    partition: Partition
    layout: WeightLayout


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
    column_major_on(model, arena.device)  # before any bytes are copied in: loads and reloads agree


def weight_layout_of(model: nn.Module) -> WeightLayout:
    """The weights-slot layout of model (built on meta in its load dtype): its distinct tensors in module
    order, each on a TENSOR_ALIGNMENT boundary. The same architecture and config always give the same."""
    return layout_tensors(module_tensor_specs(model), TENSOR_ALIGNMENT)


def load_into_partition(
    memory: MemoryManager,
    model_name: str,
    model_dir: str | Path,
    dtype: torch.dtype | str,
    kv_bytes: int,
) -> PlacedModel:
    """Load model_dir in dtype into a new partition of memory named model_name: a weights slot sized from
    the model built on meta (parameters and buffers, tied tensors once) holding every tensor as an arena
    view, and a KV pool of kv_bytes (>= 0; 0: none) left for the caller to lay out. The model becomes the
    most recently used. OutOfMemoryError if it does not fit, ModelAlreadyResidentError if the name is
    resident, CheckpointError for a bad checkpoint (the partition is released again on any failure)."""
    if model_name in memory:
        raise ModelAlreadyResidentError(model_name)
    placed: list[tuple[WeightLayout, Partition]] = []

    def materialize(model: nn.Module) -> None:
        layout = weight_layout_of(model)
        placed.append((layout, _reserve_and_bind(memory, model_name, model, layout, kv_bytes)))

    try:
        loaded = load_model(model_dir, dtype=dtype, device=memory.arena.device, materialize=materialize)
    except BaseException:
        if placed:
            memory.release(model_name)
        raise
    layout, partition = placed[0]
    return PlacedModel(loaded, partition, layout)


def load_from_host_copy(memory: MemoryManager, model_name: str, host: HostCopy, kv_bytes: int) -> PlacedModel:
    """Rebuild an evicted model in a new partition of memory named model_name, wherever it lands: reserve
    a slot of host.layout's size and a KV pool of kv_bytes (>= 0), bind the model's tensors to the slot
    as load_into_partition does, and fill it with one bulk copy of host.weights. Reads no checkpoint.
    Errors as load_into_partition, plus HostCopyMismatchError if the model built from host.config
    is not laid out as host.layout (a copy from another code version); nothing is reserved then."""
    if model_name in memory:
        raise ModelAlreadyResidentError(model_name)
    model = build_on_meta(host.config, host.dtype)
    layout = weight_layout_of(model)
    if layout != host.layout or host.nbytes != layout.total_bytes:
        raise HostCopyMismatchError(host.model, model_name)
    partition = _reserve_and_bind(memory, model_name, model, layout, kv_bytes)
    try:
        copy_host_to_slot(host.weights, memory.arena, partition.weights)
    except BaseException:
        memory.release(model_name)
        raise
    model.eval()
    loaded = LoadedModel(model, host.config, host.tokenizer, host.model_dir, host.dtype, memory.arena.device)
    return PlacedModel(loaded, partition, layout)


def evict_to_host(
    memory: MemoryManager, placed: PlacedModel, *, keep_host_copy: bool = True
) -> HostCopy | None:
    """Release placed's partition, first copying its weights slot to host memory when keep_host_copy:
    the HostCopy load_from_host_copy rebuilds it from, or None when not kept. The model's tensors still
    point into the released bytes, which the next reserve may overwrite: the caller must drop the model.
    UnknownModelError if the partition is no longer held."""
    name = placed.partition.model
    weights = memory.partition(name).weights  # the KV pool may have moved since; the slot never does
    host = None
    if keep_host_copy:
        loaded = placed.loaded
        bytes_ = copy_slot_to_host(memory.arena, weights, placed.layout.total_bytes)
        host = HostCopy(
            name, bytes_, placed.layout, loaded.config, loaded.tokenizer, loaded.model_dir, loaded.dtype
        )
    memory.release(name)
    return host


def _reserve_and_bind(
    memory: MemoryManager, model_name: str, model: nn.Module, layout: WeightLayout, kv_bytes: int
) -> Partition:
    """The one way a model gets a slot: reserve layout.total_bytes + kv_bytes, point its tensors there."""
    partition = memory.reserve(model_name, layout.total_bytes, kv_bytes)
    try:
        bind_to_arena(model, memory.arena, layout, partition.weights)
    except BaseException:
        memory.release(model_name)
        raise
    return partition
