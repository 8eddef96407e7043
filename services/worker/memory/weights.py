"""Sizing a weights slot before loading: tensor specs from safetensors headers, and their slot layout."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from services.worker.memory.allocator import ByteRange
from services.worker.models.checkpoint import HARMLESS_SUFFIXES, check_duplicate, safetensors_files
from services.worker.models.errors import CheckpointError
from services.worker.models.gguf_file import is_gguf_path, read_gguf
from services.worker.models.loader import parse_dtype

# safetensors header dtype names -> torch dtypes (the ones this torch can hold).
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to place in a weights slot: name, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """prod(shape) x itemsize."""
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class WeightLayout:
    """Where each tensor sits in a weights slot: ranges relative to the slot's start, in spec order.
    total_bytes is what the slot needs (the last range's end)."""

    ranges: dict[str, ByteRange]
    specs: dict[str, TensorSpec]
    total_bytes: int

    def place(self, slot: ByteRange, name: str) -> ByteRange:
        """The arena range of tensor `name` in a slot starting at slot.offset; KeyError for an unknown name,
        ValueError if the slot is smaller than total_bytes."""
        if slot.nbytes < self.total_bytes:
            raise ValueError(f"slot {slot} is smaller than the layout's {self.total_bytes} bytes")
        inner = self.ranges[name]
        return ByteRange(slot.offset + inner.offset, inner.nbytes)


def layout_tensors(specs: Iterable[TensorSpec], alignment: int = 1) -> WeightLayout:
    """Lay specs out back to back, each starting on a multiple of alignment (a power of two >= 1; 1 packs
    them with no padding, 256 suits CUDA kernels). ValueError for a bad alignment or a repeated name."""
    if alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    ranges: dict[str, ByteRange] = {}
    by_name: dict[str, TensorSpec] = {}
    end = 0
    for spec in specs:
        if spec.name in ranges:
            raise ValueError(f"tensor {spec.name!r} appears twice in the layout")
        # Every tensor starts aligned to at least its own itemsize, so its typed view is valid.
        step = max(alignment, spec.dtype.itemsize)
        offset = -(-end // step) * step
        ranges[spec.name] = ByteRange(offset, spec.nbytes)
        by_name[spec.name] = spec
        end = offset + spec.nbytes
    return WeightLayout(ranges, by_name, end)


def checkpoint_tensor_specs(
    checkpoint_dir: str | Path, dtype: torch.dtype | str | None = None
) -> list[TensorSpec]:
    """Every tensor the loader would keep from checkpoint_dir (harmless recomputed buffers skipped), read
    from the safetensors headers only. dtype: the load dtype floating tensors are cast to; None keeps
    the stored dtypes. CheckpointError (naming the file) for an unreadable file or unknown dtype.
    checkpoint_dir may also be a GGUF file: its tensors under their HF names, stored as float32 (the
    dtype they are dequantized to) unless dtype says otherwise."""
    cast = parse_dtype(dtype) if dtype is not None else None
    if is_gguf_path(checkpoint_dir):
        return _gguf_tensor_specs(Path(checkpoint_dir), cast)
    specs: list[TensorSpec] = []
    seen: set[str] = set()
    for file in safetensors_files(Path(checkpoint_dir)):
        try:
            handle = safe_open(str(file), framework="pt", device="cpu")
        except Exception as err:  # safetensors raises its own error type, or OSError, for bad files
            raise CheckpointError(file, f"unreadable safetensors file ({err})") from err
        with handle:
            for name in handle.keys():  # noqa: SIM118 - a safe_open handle is not a dict
                if name.endswith(HARMLESS_SUFFIXES):
                    continue
                check_duplicate(str(file), name, seen)
                header = handle.get_slice(name)
                stored = SAFETENSORS_DTYPES.get(header.get_dtype())
                if stored is None:
                    raise CheckpointError(file, f"tensor {name!r} has unsupported dtype {header.get_dtype()}")
                held = cast if cast is not None and stored.is_floating_point else stored
                specs.append(TensorSpec(name, held, tuple(header.get_shape())))
    return specs


def _gguf_tensor_specs(path: Path, cast: torch.dtype | None) -> list[TensorSpec]:
    # Imported on use, so sizing a safetensors checkpoint never imports the gguf package.
    from services.worker.models.gguf_weights import check_gguf_tensors

    gguf = read_gguf(path)
    names = check_gguf_tensors(gguf)
    held = cast if cast is not None else torch.float32
    return [TensorSpec(names[t.name], held, t.shape) for t in gguf.tensors.values()]


def weight_bytes_of(
    checkpoint_dir: str | Path, dtype: torch.dtype | str | None = None, tensor_alignment: int = 1
) -> int:
    """Bytes a weights slot needs for checkpoint_dir's tensors loaded in dtype (None: as stored), each
    starting on a multiple of tensor_alignment (1: exact sum of tensor sizes). Reads headers only, so a
    partition can be sized before loading. Model state that is not in the checkpoint (e.g. a RoPE
    table) is not counted. CheckpointError for a missing or unreadable checkpoint."""
    return layout_tensors(checkpoint_tensor_specs(checkpoint_dir, dtype), tensor_alignment).total_bytes
