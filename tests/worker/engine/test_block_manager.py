"""BlockManager with plain Sequences: accounting, all-or-nothing allocation, prefix cache, eviction."""

from __future__ import annotations

import pytest

from services.common.sampling import SamplingParams
from services.worker.engine.block_manager import BlockManager
from services.worker.engine.sequence import Sequence


def make_seq(tokens: list[int], request_id: str = "r") -> Sequence:
    return Sequence(request_id, tokens, SamplingParams(max_tokens=8))


def run_prefill(bm: BlockManager, seq: Sequence) -> None:
    """Admit, allocate and compute every token of seq, then register its full blocks."""
    bm.admit(seq)
    assert bm.allocate(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit(seq)


def test_allocate_and_free_accounting() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = make_seq(list(range(10)))
    assert bm.blocks_needed(seq, 10) == 3
    assert bm.allocate(seq, 10)
    assert len(seq.block_table) == 3
    assert len(set(seq.block_table)) == 3
    assert (bm.num_used_blocks, bm.num_free_blocks) == (3, 7)
    assert bm.usage == pytest.approx(0.3)
    # Growing within the last block needs nothing new; crossing into a new block needs one.
    seq.num_computed_tokens = 10
    assert bm.allocate(seq, 2)
    assert len(seq.block_table) == 3
    assert bm.allocate(seq, 3)
    assert len(seq.block_table) == 4
    bm.free(seq)
    assert seq.block_table == []
    assert (bm.num_used_blocks, bm.num_free_blocks, bm.usage) == (0, 10, 0.0)


def test_allocate_is_all_or_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    a, b = make_seq(list(range(12)), "a"), make_seq(list(range(8)), "b")
    assert bm.allocate(a, 12)
    assert not bm.allocate(b, 8)
    assert b.block_table == []
    assert (bm.num_used_blocks, bm.num_free_blocks) == (3, 1)
    assert bm.allocate(b, 4)


def test_allocate_respects_reserve() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq(list(range(12)))
    assert not bm.allocate(seq, 12, reserve=2)
    assert seq.block_table == []
    assert bm.allocate(seq, 12, reserve=1)


def test_shared_prefix_shares_blocks() -> None:
    bm = BlockManager(num_blocks=16, block_size=16)
    prefix = list(range(100, 140))  # 40 tokens: 2 full blocks + 8
    a = make_seq(prefix, "a")
    run_prefill(bm, a)
    assert len(a.block_hashes) == 2
    b = make_seq([*prefix, 1, 2, 3], "b")
    assert bm.admit(b) == 32
    assert b.block_table == a.block_table[:2]
    assert b.block_hashes == a.block_hashes
    assert (b.num_computed_tokens, b.num_cached_tokens) == (32, 32)
    assert [bm.refcount(blk) for blk in b.block_table] == [2, 2]
    assert bm.num_used_blocks == 3  # a's three blocks, nothing new for b yet
    assert bm.allocate(b, b.num_tokens - 32)
    assert b.block_table[2] != a.block_table[2]
    assert (bm.prefix_query_tokens, bm.prefix_hit_tokens) == (40 + 43, 32)
    assert bm.prefix_hit_rate == pytest.approx(32 / 83)
    bm.free(a)
    assert [bm.refcount(blk) for blk in b.block_table] == [1, 1, 1]
    bm.free(b)
    assert bm.num_used_blocks == 0


@pytest.mark.parametrize(
    ("num_tokens", "expected_hit"),
    [(1, 0), (16, 0), (17, 16), (32, 16), (33, 32), (48, 32), (49, 48), (60, 48)],
)
def test_hit_leaves_at_least_one_token(num_tokens: int, expected_hit: int) -> None:
    bm = BlockManager(num_blocks=16, block_size=16)
    tokens = list(range(60))
    run_prefill(bm, make_seq(tokens[:48], "owner"))  # caches 3 full blocks
    seq = make_seq(tokens[:num_tokens], "probe")
    assert bm.admit(seq) == expected_hit
    assert seq.num_computed_tokens == expected_hit
    assert len(seq.block_table) == expected_hit // 16


def test_prefix_miss_after_diverging_block() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    run_prefill(bm, make_seq(list(range(12)), "a"))
    # Block 1 differs, so block 2 must miss too even though its own tokens match (chained hash).
    seq = make_seq([0, 1, 2, 3, 99, 5, 6, 7, 8, 9, 10, 11, 12], "b")
    assert bm.admit(seq) == 4


def test_unadmit_restores_everything() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(list(range(8)), "a")
    run_prefill(bm, a)
    bm.free(a)
    stats = (bm.prefix_query_tokens, bm.prefix_hit_tokens)
    b = make_seq(list(range(9)), "b")
    assert bm.admit(b) == 8
    assert bm.num_used_blocks == 2
    bm.unadmit(b)
    assert (b.block_table, b.block_hashes, b.num_computed_tokens, b.num_cached_tokens) == ([], [], 0, 0)
    assert (bm.prefix_query_tokens, bm.prefix_hit_tokens) == stats
    assert (bm.num_used_blocks, bm.num_free_blocks) == (0, 8)
    assert bm.admit(b) == 8  # still cached


def test_cached_prefix_tokens_looks_without_touching() -> None:
    """The queued-sequence estimate: what admit would attach now, with refcounts, the eviction order and
    the hit statistics left as they were."""
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(list(range(8)), "a")
    run_prefill(bm, a)
    bm.free(a)
    before = (bm.prefix_query_tokens, bm.prefix_hit_tokens, bm.num_used_blocks, bm.num_free_blocks)
    b = make_seq(list(range(11)), "b")
    assert bm.cached_prefix_tokens(b) == 8
    assert bm.cached_prefix_tokens(make_seq(list(range(8)), "c")) == 4  # the last token is computed
    assert bm.cached_prefix_tokens(make_seq([9, *range(1, 11)], "d")) == 0
    assert (bm.prefix_query_tokens, bm.prefix_hit_tokens, bm.num_used_blocks, bm.num_free_blocks) == before
    assert (b.block_table, b.num_computed_tokens) == ([], 0)
    assert bm.admit(b) == 8
    off = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    assert off.cached_prefix_tokens(b) == 0


def test_evicts_least_recently_freed_after_plain_free_list() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    seqs = [make_seq([10 * i, 10 * i + 1], f"s{i}") for i in range(3)]
    for seq in seqs:
        run_prefill(bm, seq)
    blocks = [seq.block_table[0] for seq in seqs]
    for seq in seqs:
        bm.free(seq)
    assert (bm.num_free_blocks, bm.num_cached_blocks) == (4, 3)
    hog = make_seq(list(range(500, 504)), "hog")
    assert bm.allocate(hog, 4)  # the one plain free block, then s0's cached block
    (plain,) = set(range(4)) - set(blocks)
    assert sorted(hog.block_table) == sorted([plain, blocks[0]])
    assert bm.num_cached_blocks == 2
    hits = [bm.admit(make_seq([10 * i, 10 * i + 1, 7], f"p{i}")) for i in range(3)]
    assert hits == [0, 2, 2]


def test_free_releases_tail_first_so_head_is_evicted_last() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    seq = make_seq([1, 2, 3, 4, 5, 6])
    run_prefill(bm, seq)
    head = seq.block_table[0]
    bm.free(seq)
    hog = make_seq([9, 9, 9, 9], "hog")
    assert bm.allocate(hog, 4)
    assert head not in hog.block_table
    assert bm.admit(make_seq([1, 2, 3], "probe")) == 2


def test_hash_collision_never_serves_wrong_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, hash_fn=lambda parent, tokens: 7)
    a = make_seq([1, 2, 3, 4, 5], "a")
    run_prefill(bm, a)
    assert bm.num_cached_blocks == 1
    b = make_seq([5, 6, 7, 8, 9], "b")
    assert bm.admit(b) == 0  # same hash, different tokens
    assert bm.allocate(b, 5)
    b.num_computed_tokens = 5
    bm.commit(b)
    assert bm.num_cached_blocks == 1  # b's block stays private, a's entry is not overwritten
    assert bm.admit(make_seq([1, 2, 3, 4, 0], "c")) == 4


@pytest.mark.parametrize(
    ("num_computed", "expected_registered"),
    [(0, 0), (3, 0), (4, 1), (7, 1), (8, 2), (10, 2)],
)
def test_commit_registers_only_full_computed_blocks(num_computed: int, expected_registered: int) -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(list(range(10)))
    assert bm.allocate(seq, 10)
    seq.num_computed_tokens = num_computed
    bm.commit(seq)
    assert len(seq.block_hashes) == expected_registered
    assert bm.num_cached_blocks == expected_registered
    bm.commit(seq)  # idempotent
    assert bm.num_cached_blocks == expected_registered


def test_commit_keeps_duplicate_hash_private() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = make_seq([1, 2, 3, 4, 5], "a"), make_seq([1, 2, 3, 4, 5], "b")
    for seq in (a, b):  # both computed before either commits: no hit for b
        assert bm.allocate(seq, 5)
        seq.num_computed_tokens = 5
    bm.commit(a)
    bm.commit(b)
    assert b.block_hashes == a.block_hashes
    assert bm.num_cached_blocks == 1
    bm.free(a)
    bm.free(b)
    # b's unregistered block went to the plain free list, a's stays cached.
    assert (bm.num_free_blocks, bm.num_cached_blocks) == (8, 1)


def test_free_twice_is_safe() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq(list(range(6)))
    run_prefill(bm, seq)
    bm.free(seq)
    bm.free(seq)
    assert (bm.num_used_blocks, bm.num_free_blocks) == (0, 4)


def test_prefix_caching_off() -> None:
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    a = make_seq(list(range(8)), "a")
    run_prefill(bm, a)
    assert (a.block_hashes, bm.num_cached_blocks) == ([], 0)
    bm.free(a)
    b = make_seq(list(range(9)), "b")
    assert bm.admit(b) == 0
    assert (b.block_table, b.num_computed_tokens) == ([], 0)
    assert (bm.prefix_query_tokens, bm.prefix_hit_rate) == (0, 0.0)
    bm.unadmit(b)
    assert bm.prefix_query_tokens == 0


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (4, 0)])
def test_rejects_bad_geometry(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError):
        BlockManager(num_blocks=num_blocks, block_size=block_size)
