"""Resizing a decoder engine's KV pool in place or over a moved pool (KV repartitioning), split from
llm_engine.py: LLMEngine inherits these methods. Call them between steps, on the engine's thread."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from services.worker.engine.block_manager import BlockManager, BlocksInUseError
from services.worker.engine.config import EngineLayout
from services.worker.engine.kv_cache import (
    KVCaches,
    KVCacheSpec,
    KVPoolTooSmallError,
    kv_cache_views,
    relayout_kv_pool,
)
from services.worker.memory.allocator import ByteRange
from services.worker.memory.arena import Arena
from services.worker.memory.partition import Partition

if TYPE_CHECKING:
    from services.worker.engine.llm_engine import EngineStats
    from services.worker.engine.model_runner import ModelRunner
    from services.worker.engine.scheduler import Scheduler
    from services.worker.memory.manager import MemoryManager
    from services.worker.memory.placement import PlacedModel


class KVPoolResizing:
    """The KV-pool half of LLMEngine: what it needs of the engine is declared here."""

    layout: EngineLayout
    partition: Partition | None
    memory: MemoryManager | None
    runner: ModelRunner
    scheduler: Scheduler
    block_manager: BlockManager
    _placed: PlacedModel | None
    stats: EngineStats

    if TYPE_CHECKING:  # LLMEngine's own

        def _kv_spec(self) -> KVCacheSpec: ...

        def _check_resident(self) -> None: ...

    def kv_blocks_wanted(self) -> int:
        """KV blocks every unfinished request would hold if all ran at once, each with room for one more
        token: compare with layout.num_kv_blocks to see how short the pool is (>= 0)."""
        block_size = self.layout.block_size
        return sum(seq.num_tokens // block_size + 1 for seq in self.scheduler.unfinished())

    def shrink_kv(self, num_blocks: int) -> None:
        """Lay the KV cache out as num_blocks (1 to the current count) blocks at the start of the current
        pool, so that the pool's tail can then be given away (MemoryManager.resize_kv or move_kv, then
        rebind_kv). Held blocks keep their contents; cached ones at ids >= num_blocks are dropped.
        BlocksInUseError if a request holds such an id, KVPoolTooSmallError if an unfinished request
        would no longer fit; nothing changes then. Call between steps, on the engine's thread."""
        pool = self._kv_pool(self._own_partition())
        if not 1 <= num_blocks <= self.layout.num_kv_blocks:
            raise ValueError(f"num_blocks must be in [1, {self.layout.num_kv_blocks}], got {num_blocks}")
        self._check_requests_fit(num_blocks)
        self.block_manager.resize(num_blocks)
        spec = self._kv_spec()
        kv_caches = relayout_kv_pool(self._arena(), pool, spec, self.layout.num_kv_blocks, num_blocks)
        self._use_kv(kv_caches, num_blocks, self._own_partition())

    def rebind_kv(self) -> None:
        """Lay the KV cache over the pool the memory manager now holds for this model (after resize_kv or
        move_kv) and size the block manager to it: pool bytes // bytes per block.

        Same offset, more blocks: contents kept, the new ids free. Same offset, as many: nothing moves.
        Same offset, fewer: only when no request holds a block (the prefix cache is dropped), because
        the bytes given up may already be another model's; call shrink_kv before the manager shrinks
        the pool to keep running requests. New offset: the contents are gone, so every running request
        is preempted to recompute (greedy outputs unchanged) and the prefix cache is emptied.
        BlocksInUseError / KVPoolTooSmallError when refused (the engine is unchanged: give the pool
        back). Call between steps, on the engine's thread."""
        part = self._own_partition()
        old = self._kv_pool(self.partition)
        pool = self._kv_pool(part)
        spec = self._kv_spec()
        num_blocks = pool.nbytes // spec.bytes_per_block
        current = self.layout.num_kv_blocks
        if num_blocks < 1:
            raise KVPoolTooSmallError(
                f"a KV pool of {pool.nbytes} bytes holds no {spec.bytes_per_block}-byte block"
            )
        self._check_requests_fit(num_blocks)
        bm = self.block_manager
        if pool.offset != old.offset:
            self._preempt_all_running()
            bm.clear()
            bm.resize(num_blocks)
            kv_caches = kv_cache_views(self._arena(), pool, spec, num_blocks)
        elif num_blocks > current:
            bm.resize(num_blocks)
            kv_caches = relayout_kv_pool(self._arena(), pool, spec, current, num_blocks)
        elif num_blocks == current:
            kv_caches = self.runner.kv_caches
        else:
            if bm.num_used_blocks:
                raise BlocksInUseError(num_blocks, bm.num_used_blocks)
            bm.clear()
            bm.resize(num_blocks)
            kv_caches = kv_cache_views(self._arena(), pool, spec, num_blocks)
        self._use_kv(kv_caches, num_blocks, part)

    def _own_partition(self) -> Partition:
        """The manager's current partition of this engine's model; ValueError outside an arena."""
        self._check_resident()
        if self.memory is None or self.partition is None:
            raise ValueError(
                "only an engine built in an arena (LLMEngine(memory=...)) has a KV pool to rebind"
            )
        return self.memory.partition(self.partition.model)

    def _arena(self) -> Arena:
        assert self.memory is not None  # _own_partition checked it; not input
        return self.memory.arena

    @staticmethod
    def _kv_pool(part: Partition | None) -> ByteRange:
        if part is None or part.kv is None:
            raise KVPoolTooSmallError("the model holds no KV pool")
        return part.kv

    def _check_requests_fit(self, num_blocks: int) -> None:
        """KVPoolTooSmallError if an unfinished request could never fit num_blocks blocks: the scheduler's
        progress guarantee (a request alone always fits) must survive the resize."""
        capacity = num_blocks * self.layout.block_size
        largest = max((seq.num_tokens for seq in self.scheduler.unfinished()), default=0)
        if largest > capacity:
            raise KVPoolTooSmallError(
                f"a request in flight holds {largest} tokens; {num_blocks} blocks hold {capacity}"
            )

    def _preempt_all_running(self) -> None:
        """Send every running request back to the queue to recompute: its KV is gone (the pool moved)."""
        running = self.scheduler.preempt_all()
        for seq in running:
            self.stats.preemptions_by_class[seq.hints.workload] += 1
        self.stats.preemptions += len(running)

    def _use_kv(self, kv_caches: KVCaches, num_blocks: int, part: Partition) -> None:
        """Serve from kv_caches of num_blocks blocks in part's pool from the next step on."""
        self.runner.set_kv_caches(kv_caches)
        bytes_per_block = self._kv_spec().bytes_per_block
        self.layout = replace(
            self.layout, num_kv_blocks=num_blocks, kv_cache_bytes=num_blocks * bytes_per_block
        )
        self.partition = part
        if self._placed is not None:
            self._placed = replace(self._placed, partition=part)
        self.scheduler.resize_pool(num_blocks)
