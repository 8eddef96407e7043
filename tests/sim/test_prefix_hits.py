"""Prefix-cache hits in the engine model: whole KV blocks only, short of the prompt's last token, as the
worker's block manager attaches them (sim/prefix_cache.py's usable_hit, BlockManager.admit)."""

from __future__ import annotations

import pytest

from sim.prefix_cache import usable_hit
from tests.sim.test_engine_model import Loop, request


def test_a_follow_up_turn_on_the_same_gpu_computes_only_its_new_tokens() -> None:
    loop = Loop()
    first = request(0.0, prompt=1000, output=100, conversation=7)
    loop.engine.enqueue(first, 0.0)
    loop.run_until(10.0)
    second = request(20.0, prompt=1200, output=2, conversation=7)  # the history (1,100) and 100 new
    loop.engine.enqueue(second, 20.0)
    loop.run_until(30.0)
    # Whole 16-token blocks of the history only: 68 of them; its last 12 tokens sat in a partial block,
    # which the worker never registers, so they are computed again with the 100 new ones.
    assert second.cached == 1088 and loop.engine.prefix_hits == 1
    assert second.first_token_s - 20.0 == pytest.approx(0.010 + 112 * 0.0001)


@pytest.mark.parametrize(
    ("hit", "tokens", "block", "usable"),
    [
        (1100, 1200, 16, 1088),  # the history's whole blocks
        (1100, 1200, 1, 1100),  # token-granular
        (320, 320, 16, 304),  # the whole prompt held: its last token (and so its last block) computed
        (320, 321, 16, 320),
        (0, 50, 16, 0),
        (15, 50, 16, 0),  # less than a block
    ],
)
def test_a_prefix_hit_counts_whole_blocks_short_of_the_prompts_last_token(
    hit: int, tokens: int, block: int, usable: int
) -> None:
    """BlockManager.admit's rule: blocks entirely within the first tokens - 1."""
    assert usable_hit(hit, tokens, block) == usable
