"""One GPU's prefix cache in the engine model: which prompt prefixes its free KV blocks still hold."""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    """Prefix key -> tokens whose blocks are held, least recently used first; a prefix lives in KV blocks
    no running sequence needs, so it is evicted whenever those run short (make_room)."""

    def __init__(self) -> None:
        self._held: OrderedDict[int, int] = OrderedDict()
        self.tokens = 0  # held in all

    def longest(self, *keys: int) -> int:
        """Tokens held for whichever of keys holds most (0 for none)."""
        return max(self._held.get(key, 0) for key in keys)

    def touch(self, *keys: int) -> None:
        """Mark the held ones among keys as just used."""
        for key in keys:
            if key in self._held:
                self._held.move_to_end(key)

    def remember(self, key: int, tokens: int, room: int) -> None:
        """Hold tokens of prefix key (0: no key) as most recently used, within room free tokens."""
        if not key or tokens <= 0:
            return
        self.tokens += tokens - self._held.get(key, 0)
        self._held[key] = tokens
        self._held.move_to_end(key)
        self.make_room(room)

    def make_room(self, room: int) -> None:
        """Evict least recently used prefixes until what is held fits in room tokens."""
        while self._held and self.tokens > room:
            _, tokens = self._held.popitem(last=False)
            self.tokens -= tokens


def usable_hit(hit: int, tokens: int, block: int) -> int:
    """Of a prompt of tokens whose prefix the cache holds hit tokens of, the tokens the engine skips:
    whole KV blocks of block tokens only, within the first tokens - 1 (the last one is computed for its
    logits), as the worker's block manager attaches them (BlockManager.admit). A partly filled block is
    never registered, so a conversation's next turn recomputes its history's last partial block."""
    usable = min(hit, tokens - 1)
    return usable - usable % block
