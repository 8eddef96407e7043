"""The paged KV cache's shape and its per-layer tensors: allocated on their own, or views of an arena pool."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena

# Per layer: (K, V), each [num_blocks, block_size, kv_heads, head_dim].
KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class KVPoolTooSmallError(ValueError):
    """A KV pool too small for what the engine must hold: no block at all, or less than an unfinished
    request's tokens (maps to FAILED_PRECONDITION). Give the model more KV bytes, or drain it first."""


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


# Largest piece relayout_kv_pool copies at once: bounds the staging copy it makes outside the arena.
_MOVE_PIECE_BYTES = 64 * 1024**2


def relayout_kv_pool(
    arena: Arena, pool: ByteRange, spec: KVCacheSpec, old_blocks: int, new_blocks: int
) -> KVCaches:
    """The KV caches of new_blocks (>= 1) blocks over pool, a KV range resized in place (same offset) that
    held old_blocks: blocks [0, min(old, new)) keep their contents, added blocks are zeroed.

    The layout is layer-major (see kv_cache_views), so a block's bytes depend on the block count: each
    layer's K and V move to their new offset. Growing moves them to higher offsets, last first;
    shrinking to lower ones, first first; so nothing is overwritten before it is read.
    """
    needed = new_blocks * spec.bytes_per_block
    if new_blocks < 1 or needed > pool.nbytes:
        raise ValueError(f"{new_blocks} KV blocks need {needed} bytes; the pool {pool} holds fewer")
    chunks = 2 * spec.num_layers  # one K or V of one layer, in layer-major order
    block_bytes = spec.bytes_per_block // chunks
    span = max(old_blocks, new_blocks) * spec.bytes_per_block
    data = arena.view(ByteRange(pool.offset, span), torch.uint8, (span,))
    kept = min(old_blocks, new_blocks) * block_bytes
    order = range(chunks - 1, 0, -1) if new_blocks > old_blocks else range(1, chunks)
    for chunk in order:  # chunk 0 starts at the pool's offset either way
        _move(data, chunk * old_blocks * block_bytes, chunk * new_blocks * block_bytes, kept)
    for chunk in range(chunks) if new_blocks > old_blocks else ():
        start = chunk * new_blocks * block_bytes
        data[start + kept : start + new_blocks * block_bytes].zero_()  # why: see kv_cache_views
    shape = (spec.num_layers, 2, *spec.block_shape(new_blocks))
    pool_view = arena.view(ByteRange(pool.offset, needed), spec.dtype, shape)
    return [(pool_view[layer, 0], pool_view[layer, 1]) for layer in range(spec.num_layers)]


def _move(data: torch.Tensor, src: int, dst: int, nbytes: int) -> None:
    """memmove within the uint8 tensor data, in pieces; a piece overlapping its own source is staged."""
    if src == dst or nbytes == 0:
        return
    piece = _MOVE_PIECE_BYTES
    starts = range(0, nbytes, piece)
    # Toward higher offsets the tail must go first (its source is what the head's destination covers).
    for start in reversed(starts) if dst > src else starts:
        size = min(piece, nbytes - start)
        source = data[src + start : src + start + size]
        if abs(dst - src) < size:
            source = source.clone()
        data[dst + start : dst + start + size].copy_(source)
