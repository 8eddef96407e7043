"""The paged KV cache's shape and its per-layer tensors: allocated on their own, or views of an arena pool."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena

# Per layer: (K, V), each [num_blocks, block_size, kv_heads, head_dim].
KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the paged KV cache; bytes_per_block covers K and V of every layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def block_shape(self, num_blocks: int) -> tuple[int, int, int, int]:
        """Shape of one layer's K (or V) cache: [num_blocks, block_size, kv_heads, head_dim]."""
        return (num_blocks, self.block_size, self.num_kv_heads, self.head_dim)


def allocate_kv_caches(spec: KVCacheSpec, num_blocks: int, device: torch.device) -> KVCaches:
    """Zeroed K and V caches of num_blocks (>= 1) blocks per layer, each its own allocation."""
    shape = spec.block_shape(num_blocks)
    return [
        (
            torch.zeros(shape, dtype=spec.dtype, device=device),
            torch.zeros(shape, dtype=spec.dtype, device=device),
        )
        for _ in range(spec.num_layers)
    ]


def kv_cache_views(arena: Arena, pool: ByteRange, spec: KVCacheSpec, num_blocks: int) -> KVCaches:
    """K and V caches of num_blocks blocks per layer as views of the first num_blocks x bytes_per_block
    bytes of pool (a KV range of arena, possibly rounded up beyond that), zeroed; nothing is allocated.

    Layer-major: [layers, 2, num_blocks, block_size, kv_heads, head_dim], so each layer's K and V is one
    contiguous tensor. A block-major pool ([num_blocks, layers, 2, ...]) would let a pool resized in
    place keep its blocks, but its per-layer views are strided and the attention writes through
    cache.view(-1, kv_heads, head_dim), which needs each layer's blocks contiguous.
    """
    needed = num_blocks * spec.bytes_per_block
    if needed > pool.nbytes:
        raise ValueError(f"{num_blocks} KV blocks need {needed} bytes; the pool {pool} holds fewer")
    shape = (spec.num_layers, 2, *spec.block_shape(num_blocks))
    pool_view = arena.view(ByteRange(pool.offset, needed), spec.dtype, shape)
    # Zeroed because attention reads padding slots under a mask: a weight of 0 times a stale NaN (left
    # by whatever held these bytes before) would still be NaN.
    pool_view.zero_()
    return [(pool_view[layer, 0], pool_view[layer, 1]) for layer in range(spec.num_layers)]
