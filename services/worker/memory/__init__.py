"""Memory manager: one arena reserved at start, carved into a weights slot + KV pool per resident model."""

from services.worker.memory.allocator import ByteRange, RangeAllocator
from services.worker.memory.arena import Arena
from services.worker.memory.errors import (
    ArenaConfigError,
    HostCopyMismatchError,
    InvalidViewError,
    InvariantError,
    KVTransferError,
    MemoryManagerError,
    ModelAlreadyResidentError,
    ModelBusyError,
    ModelEvictedError,
    OutOfMemoryError,
    RangeNotAllocatedError,
    UnknownModelError,
)
from services.worker.memory.host_copy import HostCopy
from services.worker.memory.manager import MemoryManager
from services.worker.memory.partition import Partition, PartitionUsage
from services.worker.memory.placement import (
    PlacedModel,
    bind_to_arena,
    evict_to_host,
    load_from_host_copy,
    load_into_partition,
    module_tensor_specs,
    weight_layout_of,
)
from services.worker.memory.weights import TensorSpec, WeightLayout, layout_tensors, weight_bytes_of

__all__ = [
    "Arena",
    "ArenaConfigError",
    "ByteRange",
    "HostCopy",
    "HostCopyMismatchError",
    "InvalidViewError",
    "InvariantError",
    "KVTransferError",
    "MemoryManager",
    "MemoryManagerError",
    "ModelAlreadyResidentError",
    "ModelBusyError",
    "ModelEvictedError",
    "OutOfMemoryError",
    "Partition",
    "PartitionUsage",
    "PlacedModel",
    "RangeAllocator",
    "RangeNotAllocatedError",
    "TensorSpec",
    "UnknownModelError",
    "WeightLayout",
    "bind_to_arena",
    "evict_to_host",
    "layout_tensors",
    "load_from_host_copy",
    "load_into_partition",
    "module_tensor_specs",
    "weight_bytes_of",
    "weight_layout_of",
]
