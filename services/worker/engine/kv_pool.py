"""A decoder engine's KV cache as one object: how it is laid out (EngineLayout: blocks, bytes, context),
the per-layer tensors, where their bytes live (an allocation of its own, or the KV range of the model's
partition in an arena), the block manager that hands its blocks out, and resizing it in place or over a
pool the memory manager moved (KV repartitioning).

The pool knows nothing of requests: the engine passes what it must respect (the longest request in
flight) and a way to preempt them, and after a resize rebinds its runner and scheduler to the new pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from services.worker.engine.block_manager import BlockManager, BlocksInUseError
from services.worker.engine.config import EngineConfig, EngineLayout, default_kv_bytes
from services.worker.engine.kv_cache import (
    KVCaches,
    KVCacheSpec,
    KVPoolTooSmallError,
    allocate_kv_caches,
    kv_cache_views,
    relayout_kv_pool,
)
from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena
from services.worker.memory.manager import MemoryManager
from services.worker.memory.partition import Partition
from services.worker.models.config_types import DecoderConfig
from services.worker.models.loader import parse_dtype


def kv_spec(config: EngineConfig, model: DecoderConfig) -> KVCacheSpec:
    """The shape of one KV block for model under config (the cache holds the model's dtype)."""
    dtype = parse_dtype(config.dtype)
    return KVCacheSpec(
        model.num_hidden_layers, model.num_key_value_heads, model.head_dim, config.block_size, dtype
    )


def plan_layout(
    config: EngineConfig, model: DecoderConfig, device: torch.device, in_arena: bool
) -> EngineLayout:
    """How many blocks the pool gets: config.kv_cache_bytes, else (alone on CUDA) a share of the device
    memory left after the weights, else 2 GiB; never more than every seat filled to the full context
    could use unless configured. ValueError when the budget holds no block."""
    spec = kv_spec(config, model)
    max_model_len = min(config.max_model_len or model.max_model_len, model.max_model_len)
    # Free device memory sizes the pool only without an arena: in an arena the other models'
    # partitions, not the device, decide what is left.
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" and not in_arena else None
    budget = default_kv_bytes(config, free)
    most_useful = config.max_num_seqs * -(-max_model_len // spec.block_size) * spec.bytes_per_block
    if config.kv_cache_bytes is None:
        budget = min(budget, most_useful)
    num_blocks = budget // spec.bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"kv_cache_bytes={budget} holds no KV block of {spec.bytes_per_block} bytes; raise the budget"
        )
    return EngineLayout(num_blocks, spec.block_size, num_blocks * spec.bytes_per_block, max_model_len)


@dataclass
class KVPool:
    """memory / partition: the arena's manager and the model's partition whose KV range holds the pool;
    both None for a pool allocated on its own (which cannot be resized)."""

    spec: KVCacheSpec
    layout: EngineLayout
    caches: KVCaches
    blocks: BlockManager
    memory: MemoryManager | None = None
    partition: Partition | None = None

    @classmethod
    def allocated(
        cls, spec: KVCacheSpec, layout: EngineLayout, device: torch.device, prefix_caching: bool
    ) -> KVPool:
        """A pool of its own, allocated on device."""
        caches = allocate_kv_caches(spec, layout.num_kv_blocks, device)
        return cls(
            spec, layout, caches, BlockManager(layout.num_kv_blocks, layout.block_size, prefix_caching)
        )

    @classmethod
    def in_partition(
        cls,
        spec: KVCacheSpec,
        layout: EngineLayout,
        memory: MemoryManager,
        partition: Partition,
        prefix_caching: bool,
    ) -> KVPool:
        """A pool laid over partition's KV range in memory's arena."""
        assert partition.kv is not None  # the layout holds at least one block
        caches = kv_cache_views(memory.arena, partition.kv, spec, layout.num_kv_blocks)
        blocks = BlockManager(layout.num_kv_blocks, layout.block_size, prefix_caching)
        return cls(spec, layout, caches, blocks, memory, partition)

    def shrink(self, num_blocks: int, largest_request_tokens: int) -> None:
        """Lay the cache out as num_blocks (1 to the current count) blocks at the start of the current
        pool, so that its tail can then be given away (MemoryManager.resize_kv or move_kv, then rebind).
        Held blocks keep their contents; cached ones at ids >= num_blocks are dropped. BlocksInUseError
        if a request holds such an id, KVPoolTooSmallError if the longest request would no longer fit;
        nothing changes then."""
        part = self._own_partition()
        pool = _kv_range(part)
        if not 1 <= num_blocks <= self.layout.num_kv_blocks:
            raise ValueError(f"num_blocks must be in [1, {self.layout.num_kv_blocks}], got {num_blocks}")
        self._check_fits(num_blocks, largest_request_tokens)
        self.blocks.resize(num_blocks)
        caches = relayout_kv_pool(self._arena(), pool, self.spec, self.layout.num_kv_blocks, num_blocks)
        self._use(caches, num_blocks, part)

    def rebind(self, largest_request_tokens: int, preempt_all: Callable[[], None]) -> None:
        """Lay the cache over the pool the memory manager now holds for this model (after resize_kv or
        move_kv), sized pool bytes // bytes per block.

        Same offset, more blocks: contents kept, the new ids free. Same offset, as many: nothing moves.
        Same offset, fewer: only when no request holds a block (the prefix cache is dropped), because
        the bytes given up may already be another model's; shrink first to keep running requests. New
        offset: the contents are gone, so preempt_all() sends every running request back to recompute
        and the prefix cache is emptied. BlocksInUseError / KVPoolTooSmallError when refused (nothing
        changes: give the pool back)."""
        part = self._own_partition()
        old = _kv_range(self.partition)
        pool = _kv_range(part)
        num_blocks = pool.nbytes // self.spec.bytes_per_block
        current = self.layout.num_kv_blocks
        if num_blocks < 1:
            raise KVPoolTooSmallError(
                f"a KV pool of {pool.nbytes} bytes holds no {self.spec.bytes_per_block}-byte block"
            )
        self._check_fits(num_blocks, largest_request_tokens)
        if pool.offset != old.offset:
            preempt_all()
            self.blocks.clear()
            self.blocks.resize(num_blocks)
            caches = kv_cache_views(self._arena(), pool, self.spec, num_blocks)
        elif num_blocks > current:
            self.blocks.resize(num_blocks)
            caches = relayout_kv_pool(self._arena(), pool, self.spec, current, num_blocks)
        elif num_blocks == current:
            caches = self.caches
        else:
            if self.blocks.num_used_blocks:
                raise BlocksInUseError(num_blocks, self.blocks.num_used_blocks)
            self.blocks.clear()
            self.blocks.resize(num_blocks)
            caches = kv_cache_views(self._arena(), pool, self.spec, num_blocks)
        self._use(caches, num_blocks, part)

    def _own_partition(self) -> Partition:
        """The manager's current partition of this pool's model; ValueError for a pool of its own."""
        if self.memory is None or self.partition is None:
            raise ValueError(
                "only an engine built in an arena (LLMEngine(memory=...)) has a KV pool to rebind"
            )
        return self.memory.partition(self.partition.model)

    def _arena(self) -> Arena:
        assert self.memory is not None  # _own_partition checked it; not input
        return self.memory.arena

    def _check_fits(self, num_blocks: int, largest_request_tokens: int) -> None:
        """KVPoolTooSmallError if the longest request in flight could never fit num_blocks blocks: the
        scheduler's progress guarantee (a request alone always fits) must survive the resize."""
        capacity = num_blocks * self.layout.block_size
        if largest_request_tokens > capacity:
            held = largest_request_tokens
            raise KVPoolTooSmallError(
                f"a request in flight holds {held} tokens; {num_blocks} blocks hold {capacity}"
            )

    def _use(self, caches: KVCaches, num_blocks: int, part: Partition) -> None:
        self.caches = caches
        self.layout = replace(
            self.layout, num_kv_blocks=num_blocks, kv_cache_bytes=num_blocks * self.spec.bytes_per_block
        )
        self.partition = part


def _kv_range(part: Partition | None) -> ByteRange:
    if part is None or part.kv is None:
        raise KVPoolTooSmallError("the model holds no KV pool")
    return part.kv
