"""A resident model's weights copied to host memory on eviction, so that it reloads with one bulk copy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena
from services.worker.memory.weights import WeightLayout
from services.worker.models.config_types import DecoderConfig, EncoderConfig
from services.worker.models.tokenizer import Tokenizer


@dataclass(frozen=True)
class HostCopy:
    """Everything needed to rebuild an evicted model without reading its checkpoint.

    weights: the first layout.total_bytes bytes of its weights slot, as a flat uint8 CPU tensor (pinned
    when it came from CUDA, so the copy back runs at full bus speed). layout: where each parameter and
    buffer sits in those bytes; a reload lays the slot out the same way, at whatever offset it gets.
    model: the name it was resident under. config, tokenizer, model_dir, dtype: as its LoadedModel had
    them (model_dir only names where it came from; nothing is read from it again).
    """

    model: str
    weights: torch.Tensor
    layout: WeightLayout
    config: DecoderConfig | EncoderConfig
    tokenizer: Tokenizer | None
    model_dir: Path
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of host memory the weights take (the layout's total, tensor padding included)."""
        return self.weights.numel()

    @property
    def pinned(self) -> bool:
        """True when the bytes are in page-locked memory (only for a copy of a CUDA arena)."""
        return self.weights.is_pinned()


def slot_bytes(arena: Arena, slot: ByteRange, nbytes: int) -> torch.Tensor:
    """The first nbytes (<= slot.nbytes) of slot as a flat uint8 view of the arena."""
    if nbytes > slot.nbytes:
        raise ValueError(f"{nbytes} bytes do not fit in slot {slot}")
    return arena.view(ByteRange(slot.offset, nbytes), torch.uint8, (nbytes,))


def copy_slot_to_host(arena: Arena, slot: ByteRange, nbytes: int) -> torch.Tensor:
    """A new CPU uint8 tensor holding the first nbytes of slot; page-locked when the arena is on CUDA
    (pageable memory would make the reload stage through a bounce buffer at a fraction of the speed)."""
    source = slot_bytes(arena, slot, nbytes)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=arena.device.type == "cuda")
    host.copy_(source)  # blocking: the slot is released right after, and may be overwritten at once
    return host


def copy_host_to_slot(host: torch.Tensor, arena: Arena, slot: ByteRange) -> None:
    """Copy all of host (flat uint8) into the start of slot in one transfer; returns once the bytes are
    in place, so the first step that reads them needs no extra synchronisation."""
    target = slot_bytes(arena, slot, host.numel())
    target.copy_(host, non_blocking=host.is_pinned())
    if arena.device.type == "cuda":
        torch.cuda.current_stream(arena.device).synchronize()
