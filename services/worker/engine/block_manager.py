"""Paged-KV bookkeeping: block ids, refcounts and the automatic prefix cache. No tensors, no torch.

Blocks are ints 0..num_blocks-1; token p of a sequence lives in seq.block_table[p // block_size].
A FULL, computed block may be registered in the prefix cache under a hash chained over every token
before it, so a later sequence with the same leading tokens can reuse its KV instead of recomputing.
A block at refcount 0 that holds a registered hash stays cached ("evictable") until its id is needed.

Admission protocol (the scheduler's side): `admit(seq)` attaches cached blocks and advances
seq.num_computed_tokens; if the following `allocate` fails, `unadmit(seq)` undoes all of it, including
the statistics, so a head-of-line sequence retried every step is counted once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from services.worker.engine.sequence import Sequence

BlockHashFn = Callable[[int, tuple[int, ...]], int]


class BlocksInUseError(RuntimeError):
    """A resize would drop blocks that live sequences still hold (maps to FAILED_PRECONDITION): finish or
    abort those requests first. num_held: how many of the dropped ids are held."""

    def __init__(self, num_blocks: int, num_held: int) -> None:
        super().__init__(
            f"cannot shrink the KV pool to {num_blocks} blocks: {num_held} block(s) with a higher id are "
            "held by requests in flight"
        )
        self.num_blocks = num_blocks
        self.num_held = num_held


# Parent hash of block 0; any fixed value works, it only has to be the same for every sequence.
_ROOT_HASH = 0x5EED_B10C


def chain_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """Hash of one full block given its parent's hash; ints and tuples of ints hash deterministically."""
    return hash((parent, tokens))


class BlockManager:
    """Owns which KV blocks are free, held (refcount > 0) or cached-and-evictable."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_fn: BlockHashFn = chain_hash,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._hash_fn = hash_fn
        self._refcount = [0] * num_blocks
        # Reversed so that pop() hands out low ids first: only cosmetic, makes tests and logs readable.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # Refcount-0 blocks that still hold a registered hash, least recently freed first.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._cache: dict[int, int] = {}  # chained hash -> block id
        self._block_hash: list[int | None] = [None] * num_blocks  # hash a block is registered under
        # Kept per cached block so a hash collision is detected instead of serving another prompt's KV.
        self._block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._num_used = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be allocated right now: plain free plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by live sequences (refcount > 0); 0 once every sequence is freed."""
        return self._num_used

    @property
    def num_cached_blocks(self) -> int:
        """Blocks currently registered in the prefix cache, held or evictable."""
        return len(self._cache)

    def refcount(self, block: int) -> int:
        """How many live sequences hold block (0 when free or only cached)."""
        return self._refcount[block]

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences, in [0, 1]."""
        return self._num_used / self.num_blocks

    @property
    def prefix_hit_rate(self) -> float:
        """prefix_hit_tokens / prefix_query_tokens over all admissions, in [0, 1]; 0 before any query."""
        if self.prefix_query_tokens == 0:
            return 0.0
        return self.prefix_hit_tokens / self.prefix_query_tokens

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks seq needs to cover positions [0, num_computed_tokens + num_new_tokens); >= 0."""
        num_slots = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-num_slots // self.block_size) - len(seq.block_table))

    def admit(self, seq: Sequence) -> int:
        """Attach the longest cached prefix of a fresh WAITING seq; returns the hit token count (0 if off).

        Only blocks entirely within the first num_tokens - 1 tokens count, so at least one token is
        left to compute (the model must run to produce logits). Undo with `unadmit` if allocate fails.
        """
        if not self.enable_prefix_caching:
            return 0
        hashes, blocks = self._longest_cached(seq)
        refcount = self._refcount
        for block in blocks:
            if refcount[block] == 0:
                del self._evictable[block]
                self._num_used += 1
            refcount[block] += 1
        num_hit = len(blocks) * self.block_size
        seq.block_table.extend(blocks)
        seq.block_hashes = hashes
        seq.num_computed_tokens = num_hit
        seq.num_cached_tokens = num_hit
        self.prefix_query_tokens += seq.num_tokens
        self.prefix_hit_tokens += num_hit
        return num_hit

    def cached_prefix_tokens(self, seq: Sequence) -> int:
        """The tokens `admit` would attach to seq now, touching nothing (no refcount, order or statistics):
        an estimate for a queued sequence, whose blocks may be evicted before it is admitted."""
        if not self.enable_prefix_caching:
            return 0
        return len(self._longest_cached(seq)[1]) * self.block_size

    def _longest_cached(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """The hashes and block ids of seq's longest cached prefix of whole blocks within its first
        num_tokens - 1 tokens."""
        token_ids = seq.token_ids
        bs = self.block_size
        cache = self._cache
        block_tokens = self._block_tokens
        hashes: list[int] = []
        blocks: list[int] = []
        parent = _ROOT_HASH
        for start in range(0, ((seq.num_tokens - 1) // bs) * bs, bs):
            tokens = tuple(token_ids[start : start + bs])
            h = self._hash_fn(parent, tokens)
            block = cache.get(h)
            if block is None or block_tokens[block] != tokens:
                break
            hashes.append(h)
            blocks.append(block)
            parent = h
        return hashes, blocks

    def unadmit(self, seq: Sequence) -> None:
        """Undo `admit` (blocks, progress, statistics); only valid before any allocate for seq succeeded."""
        if self.enable_prefix_caching:
            self.prefix_query_tokens -= seq.num_tokens
            self.prefix_hit_tokens -= seq.num_cached_tokens
        self.free(seq)
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0

    def allocate(self, seq: Sequence, num_new_tokens: int, reserve: int = 0) -> bool:
        """Grow seq.block_table to cover num_computed_tokens + num_new_tokens positions, all or nothing.

        reserve: blocks that must still be allocatable afterwards (the scheduler's watermark).
        Returns False and changes nothing when there is no room.
        """
        need = self.blocks_needed(seq, num_new_tokens)
        if need == 0:
            return True
        if need > len(self._free) + len(self._evictable) - reserve:
            return False
        refcount = self._refcount
        table = seq.block_table
        free = self._free
        for _ in range(need):
            # Plain free blocks first: evicting throws away KV someone might still hit.
            block = free.pop() if free else self._evict_one()
            refcount[block] = 1
            table.append(block)
        self._num_used += need
        return True

    def commit(self, seq: Sequence) -> None:
        """Register seq's newly full, computed blocks in the prefix cache and extend seq.block_hashes."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = min(seq.num_computed_tokens, seq.num_tokens, len(seq.block_table) * bs) // bs
        hashes = seq.block_hashes
        if len(hashes) >= num_full:
            return
        token_ids = seq.token_ids
        table = seq.block_table
        cache = self._cache
        parent = hashes[-1] if hashes else _ROOT_HASH
        for i in range(len(hashes), num_full):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = self._hash_fn(parent, tokens)
            hashes.append(h)
            block = table[i]
            # Another block already serves this hash: keep ours private rather than dedupe in place,
            # since the runner may already have this step's block table for seq.
            if h not in cache and self._block_hash[block] is None:
                cache[h] = block
                self._block_hash[block] = h
                self._block_tokens[block] = tokens
            parent = h

    def free(self, seq: Sequence) -> None:
        """Release every block of seq and clear its block table and hashes; safe to call twice."""
        refcount = self._refcount
        block_hash = self._block_hash
        # Tail first, so the head of a prompt (the part most likely shared) is evicted last.
        for block in reversed(seq.block_table):
            refcount[block] -= 1
            if refcount[block] == 0:
                self._num_used -= 1
                if block_hash[block] is not None:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
        seq.block_table.clear()
        seq.block_hashes = []

    def num_held_from(self, num_blocks: int) -> int:
        """How many block ids >= num_blocks live sequences hold: what resize(num_blocks) would refuse."""
        return sum(1 for count in self._refcount[num_blocks:] if count > 0)

    def resize(self, num_blocks: int) -> None:
        """Make the pool num_blocks (>= 1) blocks. Growing adds free ids; shrinking drops ids >= num_blocks,
        which must be free or only cached (their cache entries go), else BlocksInUseError and nothing
        changes. Ids below num_blocks keep their refcounts and cache entries."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        old = self.num_blocks
        if num_blocks < old:
            held = self.num_held_from(num_blocks)
            if held:
                raise BlocksInUseError(num_blocks, held)
            for block in range(num_blocks, old):
                h = self._block_hash[block]
                if h is not None:  # held blocks were refused above, so this one is evictable
                    del self._evictable[block]
                    del self._cache[h]
            self._free = [block for block in self._free if block < num_blocks]
            del self._refcount[num_blocks:]
            del self._block_hash[num_blocks:]
            del self._block_tokens[num_blocks:]
        else:
            # New ids at the bottom of the stack: low ids are still handed out first.
            self._free[:0] = range(num_blocks - 1, old - 1, -1)
            extra = num_blocks - old
            self._refcount.extend([0] * extra)
            self._block_hash.extend([None] * extra)
            self._block_tokens.extend([None] * extra)
        self.num_blocks = num_blocks

    def clear(self) -> None:
        """Forget every cached block (their KV is gone: the pool moved). BlocksInUseError if any block is
        held; the prefix statistics are kept."""
        if self._num_used:
            raise BlocksInUseError(self.num_blocks, self._num_used)
        self._evictable.clear()
        self._cache.clear()
        self._block_hash = [None] * self.num_blocks
        self._block_tokens = [None] * self.num_blocks
        self._free = list(range(self.num_blocks - 1, -1, -1))

    def _evict_one(self) -> int:
        """Take the least recently freed cached block and drop its cache entry; caller checked room."""
        block, _ = self._evictable.popitem(last=False)
        h = self._block_hash[block]
        if h is not None:
            del self._cache[h]
        self._block_hash[block] = None
        self._block_tokens[block] = None
        return block
