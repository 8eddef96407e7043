"""The arena: one buffer reserved at start, from which every weight and KV tensor is a typed view."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from services.worker.memory.allocator import ByteRange
from services.worker.memory.errors import ArenaConfigError, InvalidViewError, format_bytes


class Arena:
    """One uint8 buffer of total_bytes on device, allocated here and never again.

    Everything the worker serves from (weights, KV pools) is a zero-copy view into it made by view(), so
    after construction serving allocates nothing and switching models moves no bytes. Which ranges are
    in use is not the arena's business: the MemoryManager's allocator keeps that accounting.
    """

    def __init__(self, total_bytes: int, device: torch.device | str = "cpu") -> None:
        if total_bytes < 1:
            raise ArenaConfigError(f"the arena needs at least 1 byte, got {total_bytes}")
        self._device = torch.device(device)
        self._buffer = torch.empty(total_bytes, dtype=torch.uint8, device=self._device)

    @classmethod
    def for_device(
        cls, device: torch.device | str, fraction: float | None = None, byte_budget: int | None = None
    ) -> Arena:
        """An arena on device sized by exactly one of: fraction in (0, 1] of the device's total memory
        (CUDA only; see cuda_arena_bytes), or byte_budget bytes (> 0; the only way on CPU).
        ArenaConfigError otherwise, or if the size exceeds the CUDA device's free memory."""
        device = torch.device(device)
        if fraction is not None and byte_budget is not None:
            raise ArenaConfigError(
                f"give the arena a fraction of the device's memory or a byte budget, not both "
                f"(got fraction={fraction}, byte_budget={byte_budget})"
            )
        if fraction is not None and not 0.0 < fraction <= 1.0:
            raise ArenaConfigError(
                f"the arena's fraction of the device's memory must be in (0, 1], got {fraction}"
            )
        if byte_budget is not None and byte_budget < 1:
            raise ArenaConfigError(f"the arena's byte budget must be positive, got {byte_budget}")
        if device.type != "cuda":
            if byte_budget is None:
                raise ArenaConfigError(
                    f"an arena on {device} needs a byte budget (a fraction of the device's memory is only "
                    "measured on CUDA)"
                )
            return cls(byte_budget, device)
        free, total = torch.cuda.mem_get_info(device)
        if byte_budget is not None:
            if byte_budget > free:
                raise ArenaConfigError(
                    f"the arena's byte budget of {format_bytes(byte_budget)} exceeds the "
                    f"{format_bytes(free)} free on {device}"
                )
            return cls(byte_budget, device)
        if fraction is None:
            raise ArenaConfigError(f"an arena on {device} needs a fraction of its memory or a byte budget")
        return cls(cuda_arena_bytes(fraction, free, total, str(device)), device)

    @property
    def total_bytes(self) -> int:
        """Size of the arena in bytes; fixed at construction."""
        return self._buffer.numel()

    @property
    def device(self) -> torch.device:
        """Where the arena lives."""
        return self._device

    @property
    def data_ptr(self) -> int:
        """Address of the arena's first byte; every view's storage starts here."""
        return self._buffer.untyped_storage().data_ptr()

    def view(self, byte_range: ByteRange, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
        """A tensor of dtype and shape (non-negative ints) sharing the arena's bytes in byte_range: writes
        through it change the arena. InvalidViewError if the range leaves the arena, its size is not
        prod(shape) x itemsize, or its offset is not a multiple of the dtype's itemsize."""
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise InvalidViewError(f"a view's shape needs non-negative sizes, got {shape}")
        if byte_range.end > self.total_bytes:
            raise InvalidViewError(f"{byte_range} ends past the arena's {format_bytes(self.total_bytes)}")
        itemsize = dtype.itemsize
        expected = math.prod(shape) * itemsize
        if byte_range.nbytes != expected:
            raise InvalidViewError(
                f"{byte_range} holds {byte_range.nbytes} bytes but shape {shape} of {dtype} needs {expected}"
            )
        # The buffer's own start is aligned far beyond any itemsize, but check the address itself so a
        # misaligned view fails here with a message rather than inside a kernel.
        if (self.data_ptr + byte_range.offset) % itemsize:
            raise InvalidViewError(
                f"{byte_range} starts at an offset not a multiple of {dtype}'s {itemsize} bytes"
            )
        raw = self._buffer[byte_range.offset : byte_range.end]
        return raw.view(dtype).view(shape)


def cuda_arena_bytes(fraction: float, free: int, total: int, device: str = "cuda") -> int:
    """fraction of the device's total memory (not of what is free when this worker starts: two workers
    sharing a GPU with 0.45 each then get the same size in either start order, where shares of free
    memory raced); ArenaConfigError when that is more than is free now, naming who must give way."""
    nbytes = int(total * fraction)
    if nbytes < 1:
        raise ArenaConfigError(f"{fraction} of the {format_bytes(total)} of {device} is no memory")
    if nbytes > free:
        raise ArenaConfigError(
            f"the arena's share {fraction} of {device} is {format_bytes(nbytes)}, but only "
            f"{format_bytes(free)} of its {format_bytes(total)} are free: another process holds the rest "
            "(lower HANZO_WORKER_ARENA_FRACTION so the workers sharing this GPU add up to at most 1)"
        )
    return nbytes
