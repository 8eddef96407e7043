"""KV repartitioning: a model under pressure takes KV blocks from an idle one in the same arena, without
reloading either. The memory manager moves the bytes; each engine then lays its cache over its new pool.

Both engines are held (AsyncLLM.paused) for the whole move, donor first: if the taker's pool must move,
its old bytes may become the donor's, so neither may step until both caches are rebound. Holding two
engines cannot deadlock (an engine thread never waits for another engine; see async_llm).
"""

from __future__ import annotations

from services.worker.engine.async_llm import AsyncLLM
from services.worker.engine.kv_cache import KVPoolTooSmallError
from services.worker.engine.llm_engine import LLMEngine
from services.worker.memory.errors import KVTransferError, ModelBusyError
from services.worker.memory.manager import MemoryManager


class NotSharedArenaError(ValueError):
    """The two engines' KV pools are not in one MemoryManager's arena, so no bytes can move between them
    (a programming error in the caller: maps to FAILED_PRECONDITION)."""


async def take_kv_if_short(donor: AsyncLLM, taker: AsyncLLM, *, min_donor_blocks: int = 1) -> int:
    """Move to taker the KV bytes it is short of, as far as the idle donor can spare them
    (kv_bytes_to_move), read with both engines held so the numbers are the ones the move acts on; returns
    the bytes moved (0: taker not short, or donor busy). Cheap to call when nothing is due: a racy
    estimate from this thread decides whether the engines are held at all. Errors as move_kv_blocks."""
    if kv_bytes_to_move(taker.engine, donor.engine, min_donor_blocks=min_donor_blocks) == 0:
        return 0  # estimate only (read between the engines' steps by luck): nothing held for nothing
    async with donor.paused() as held_donor, taker.paused() as held_taker:
        nbytes = kv_bytes_to_move(held_taker.engine, held_donor.engine, min_donor_blocks=min_donor_blocks)
    if nbytes == 0:
        return 0
    await move_kv_blocks(donor, taker, nbytes)  # holds both again and re-checks that the donor is idle
    return nbytes


async def move_kv_blocks(donor: AsyncLLM, taker: AsyncLLM, nbytes: int) -> tuple[int, int]:
    """Move nbytes (> 0, rounded up to the arena's alignment) of KV pool from donor's model to taker's
    and rebind both caches; returns their new KV block counts (donor, taker). The taker keeps serving:
    its running requests keep their KV (or, if its pool had to move, are recomputed with the same
    outputs). ModelBusyError if the donor has requests in flight, KVPoolTooSmallError if the donor
    would keep no block, NotSharedArenaError / KVTransferError / OutOfMemoryError as the move is
    impossible; on any error no byte has moved and both engines serve as before (the donor may have
    lost prefix-cache entries)."""
    memory = _shared_memory(donor.engine, taker.engine)
    if donor is taker:
        raise KVTransferError("cannot move KV bytes from an engine to itself")
    if nbytes < 1:
        raise KVTransferError(f"must move at least 1 byte of KV, got {nbytes}")
    async with donor.paused() as held_donor, taker.paused() as held_taker:
        giver = held_donor.engine
        donor_model, taker_model = _model_of(giver), _model_of(held_taker.engine)
        in_flight = giver.scheduler.num_running + giver.scheduler.num_waiting
        if in_flight:
            raise ModelBusyError(donor_model, in_flight)
        size = -(-nbytes // memory.alignment) * memory.alignment
        keep = (memory.partition(donor_model).kv_bytes - size) // _block_bytes(giver)
        if keep < 1:
            raise KVPoolTooSmallError(
                f"model {donor_model!r} would keep {max(keep, 0)} KV blocks after giving {size} bytes"
            )
        # Compact the donor first, while it still owns the tail: a pool shrunk in place keeps its prefix
        # cache (it holds no requests, so nothing else is at stake).
        await held_donor.call(lambda engine: engine.shrink_kv(keep))
        try:
            memory.move_kv(donor_model, taker_model, nbytes)
        except Exception:
            await held_donor.call(LLMEngine.rebind_kv)  # back to the pool it never gave up
            raise
        await held_donor.call(LLMEngine.rebind_kv)
        await held_taker.call(LLMEngine.rebind_kv)
        return giver.layout.num_kv_blocks, held_taker.engine.layout.num_kv_blocks


def kv_bytes_to_move(taker: LLMEngine, donor: LLMEngine, *, min_donor_blocks: int = 1) -> int:
    """Bytes the taker should take from the donor now (0: none), a multiple of the arena's alignment.

    The taker's shortfall is kv_blocks_wanted() - its block count (every unfinished request running at
    once, with room for one more token); the donor can spare all its blocks but min_donor_blocks (>= 1)
    if it holds no request, else none (move_kv_blocks would refuse). The result is the smaller, in
    bytes, rounded down to the alignment. Read both engines between steps (on their threads or held).
    """
    if min_donor_blocks < 1:
        raise ValueError(f"min_donor_blocks must be >= 1, got {min_donor_blocks}")
    memory = _shared_memory(donor, taker)
    shortfall = taker.kv_blocks_wanted() - taker.layout.num_kv_blocks
    if shortfall <= 0 or donor.has_unfinished_requests():
        return 0
    spare = donor.layout.num_kv_blocks - min_donor_blocks
    wanted = min(shortfall * _block_bytes(taker), max(spare, 0) * _block_bytes(donor))
    return wanted // memory.alignment * memory.alignment


def _shared_memory(donor: LLMEngine, taker: LLMEngine) -> MemoryManager:
    if donor.memory is None or donor.memory is not taker.memory:
        raise NotSharedArenaError("both engines must be built in the same MemoryManager (memory=...)")
    return donor.memory


def _model_of(engine: LLMEngine) -> str:
    if engine.partition is None:
        raise NotSharedArenaError(f"engine {engine.model_name!r} holds no partition (it was evicted)")
    return engine.partition.model


def _block_bytes(engine: LLMEngine) -> int:
    """Bytes of one KV block of engine's model (K and V of every layer)."""
    return engine.layout.kv_cache_bytes // engine.layout.num_kv_blocks
