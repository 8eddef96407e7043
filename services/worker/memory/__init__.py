"""Memory manager: one arena reserved at start, carved into a weights slot + KV pool per resident model."""

from services.worker.memory.allocator import ByteRange, RangeAllocator
from services.worker.memory.arena import Arena
from services.worker.memory.errors import (
    ArenaConfigError,
    InvalidViewError,
    InvariantError,
    KVTransferError,
    MemoryManagerError,
    ModelAlreadyResidentError,
    OutOfMemoryError,
    RangeNotAllocatedError,
    UnknownModelError,
)
from services.worker.memory.manager import MemoryManager
from services.worker.memory.partition import Partition, PartitionUsage
from services.worker.memory.placement import bind_to_arena, load_into_partition, module_tensor_specs
from services.worker.memory.weights import TensorSpec, WeightLayout, layout_tensors, weight_bytes_of

__all__ = [
    "Arena",
    "ArenaConfigError",
    "ByteRange",
    "InvalidViewError",
    "InvariantError",
    "KVTransferError",
    "MemoryManager",
    "MemoryManagerError",
    "ModelAlreadyResidentError",
    "OutOfMemoryError",
    "Partition",
    "PartitionUsage",
    "RangeAllocator",
    "RangeNotAllocatedError",
    "TensorSpec",
    "UnknownModelError",
    "WeightLayout",
    "bind_to_arena",
    "layout_tensors",
    "load_into_partition",
    "module_tensor_specs",
    "weight_bytes_of",
]
