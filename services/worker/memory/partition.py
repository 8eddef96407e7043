"""What one resident model holds in the arena: a weights slot and a KV pool, as byte ranges."""

from __future__ import annotations

from dataclasses import dataclass

from services.worker.memory.allocator import ByteRange


@dataclass(frozen=True)
class Partition:
    """The arena bytes of one resident model. weights: its weights slot. kv: its KV block pool, or None
    when it has none (an embedding encoder, or a decoder that gave all of its KV bytes away).

    Immutable: every MemoryManager operation that changes a partition returns the new one. A kv range
    whose offset is unchanged kept its bytes (it grew or shrank at its end); a new offset means the pool
    moved and its old contents are gone.
    """

    model: str
    weights: ByteRange
    kv: ByteRange | None

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights slot (a multiple of the manager's alignment)."""
        return self.weights.nbytes

    @property
    def kv_bytes(self) -> int:
        """Bytes of the KV pool; 0 when there is none."""
        return self.kv.nbytes if self.kv is not None else 0

    @property
    def nbytes(self) -> int:
        """All the arena bytes this model holds."""
        return self.weight_bytes + self.kv_bytes

    def ranges(self) -> list[ByteRange]:
        """The byte ranges it holds: the weights slot, then the KV pool if any."""
        return [self.weights] if self.kv is None else [self.weights, self.kv]

    def usage(self) -> PartitionUsage:
        """Its byte counts, without the ranges."""
        return PartitionUsage(weight_bytes=self.weight_bytes, kv_bytes=self.kv_bytes)


@dataclass(frozen=True)
class PartitionUsage:
    """How many arena bytes one model holds, for metrics, placement reports and logs."""

    weight_bytes: int
    kv_bytes: int

    @property
    def total_bytes(self) -> int:
        """weight_bytes + kv_bytes."""
        return self.weight_bytes + self.kv_bytes
