"""Typed errors of the memory manager; the gRPC layer maps each class to one status code."""

from __future__ import annotations


def format_bytes(nbytes: int) -> str:
    """nbytes as "1,234,567 bytes (1.2 MiB)": exact for logs and tests, rounded for people."""
    if abs(nbytes) < 1024:
        return f"{nbytes:,} bytes"
    units = ("KiB", "MiB", "GiB", "TiB")
    value, power = nbytes / 1024, 0
    while abs(value) >= 1024 and power < len(units) - 1:
        value, power = value / 1024, power + 1
    return f"{nbytes:,} bytes ({value:.1f} {units[power]})"


class MemoryManagerError(Exception):
    """Base class of every error the memory package raises on purpose. (Not named MemoryError: that is
    Python's own out-of-heap error, which callers must never confuse with a full arena.)"""


class ArenaConfigError(MemoryManagerError, ValueError):
    """The arena cannot be sized as configured (wrong device/fraction/budget combination, or a budget
    larger than the device has free). Raised at start; the worker should exit with this message."""


class InvalidViewError(MemoryManagerError, ValueError):
    """A typed view was asked for a byte range outside the arena, a size not equal to shape x itemsize,
    or an offset not aligned to the dtype. A programming error in the caller, never a client's fault."""


class RangeNotAllocatedError(MemoryManagerError, ValueError):
    """free/try_resize got a byte range the allocator did not hand out (or already took back)."""


class KVTransferError(MemoryManagerError, ValueError):
    """move_kv was asked for an impossible transfer: to the same model, of no bytes, or of more KV
    bytes than the donor holds."""


class InvariantError(MemoryManagerError, RuntimeError):
    """check() found the byte accounting inconsistent (overlap, gap, misalignment). A bug, not input."""


class UnknownModelError(MemoryManagerError, KeyError):
    """No partition is held for this model (maps to NOT_FOUND)."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model

    def __str__(self) -> str:
        # KeyError's str() is the repr of its key; say what is wrong instead.
        return f"model {self.model!r} has no partition (it is not resident)"


class ModelAlreadyResidentError(MemoryManagerError, ValueError):
    """reserve() for a model that already holds a partition; release it first (maps to ALREADY_EXISTS)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model!r} already holds a partition; release it before reserving again")
        self.model = model


class OutOfMemoryError(MemoryManagerError):
    """The arena cannot hold what was asked (maps to RESOURCE_EXHAUSTED).

    model: whose partition it was for; needed: bytes asked for (after alignment); free: bytes free in the
    arena; largest_free: the largest contiguous free range, which is what a single slot needs. When
    free >= needed the arena is fragmented rather than full, and the message says so. weight_bytes and
    kv_bytes: the two ranges a refused new partition asked for (None for other requests), so a caller
    can plan which models to evict to make room for exactly that.
    """

    def __init__(
        self,
        model: str,
        needed: int,
        free: int,
        largest_free: int,
        *,
        what: str = "partition",
        weight_bytes: int | None = None,
        kv_bytes: int | None = None,
    ):
        self.model = model
        self.needed = needed
        self.free = free
        self.largest_free = largest_free
        self.what = what
        self.weight_bytes = weight_bytes
        self.kv_bytes = kv_bytes
        if free >= needed:
            why = (
                f"{format_bytes(free)} are free in total, but fragmented: the largest contiguous range "
                f"is {format_bytes(largest_free)}"
            )
        else:
            why = f"only {format_bytes(free)} are free, {format_bytes(needed - free)} short"
        super().__init__(
            f"cannot fit the {what} of model {model!r}: it needs {format_bytes(needed)}; {why}; "
            "evict a model or shrink another model's KV pool"
        )

    def __reduce__(self) -> tuple[object, ...]:
        # Exceptions pickle their args by default; ours are the constructor's, not the message.
        fields = (self.model, self.needed, self.free, self.largest_free, self.what)
        return (_rebuild_oom, (*fields, self.weight_bytes, self.kv_bytes))


def _rebuild_oom(
    model: str, needed: int, free: int, largest_free: int, what: str, weight_bytes: int | None,
    kv_bytes: int | None,
) -> OutOfMemoryError:  # fmt: skip
    return OutOfMemoryError(
        model, needed, free, largest_free, what=what, weight_bytes=weight_bytes, kv_bytes=kv_bytes
    )


class HostCopyMismatchError(MemoryManagerError, ValueError):
    """A host copy's weight layout is not the one its model now gets (made by another code version, or
    for another config): its bytes cannot be bound, so reload the model from its checkpoint instead."""

    def __init__(self, copied: str, model: str) -> None:
        super().__init__(
            f"the host copy of model {copied!r} does not match the layout model {model!r} would get; "
            "load it from its checkpoint"
        )
        self.copied = copied
        self.model = model


class ModelBusyError(MemoryManagerError):
    """evict() was refused because the model still has requests in flight (maps to FAILED_PRECONDITION):
    drain them, or evict with abort_running=True."""

    def __init__(self, model: str, num_requests: int) -> None:
        super().__init__(
            f"model {model!r} has {num_requests} request(s) in flight; drain them or evict with "
            "abort_running=True"
        )
        self.model = model
        self.num_requests = num_requests


class ModelEvictedError(MemoryManagerError, RuntimeError):
    """The engine's model was evicted: its memory belongs to other models now (maps to UNAVAILABLE).
    Build a new engine (from the host copy) to serve it again."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model!r} was evicted; reload it before sending requests")
        self.model = model
