"""llm-d's prefix-cache scorer, as its inference scheduler runs it by default (the approximate prefix
index of the Gateway API Inference Extension's prefix-cache-scorer), over the simulator's prefix chains.

What llm-d does: it cuts the prompt into blocks of the model server's KV block (16 tokens, auto-tuned),
at most 256 of them (the rest of a longer prompt is not looked at), each hash chained to the one before.
Its index maps a block hash to the servers it was sent to, each server keeping an LRU of as many
blocks as its KV cache holds (auto-tuned; 31,250 where unknown). A request's blocks are walked from the
first until no server holds one, each server's match the last block it holds on the way, and its score
is that match over the prompt's blocks: 1 for a server holding the whole prompt, 0.1 for one holding a
tenth of it. After each decision every block of the request is added for the chosen server.

The simulator's prompts are not text but prefix chains (sim/request.py: a tenant's tools or a batch
job's instruction, then the conversation so far), so the index keeps, per chain element and server, how
far into the prompt that server was sent along the element (the whole prompt for its last element),
and a request matches a server up to the lesser of that and where the element ends in its own prompt.
A server's LRU counts each element's blocks, and the blocks of an earlier prompt that a later one did
not extend (a batch job's previous document) stay in it under a key of their own until evicted.

A batch job's instruction is held by most of the servers of its model, so a match reads each element's
servers as arrays (their rows looked up again only when a server joins or leaves the element or the
fleet), not server by server.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from services.placer.cluster.snapshot import ClusterSnapshot
from services.placer.pick.query import PickQuery

BLOCK_TOKENS = 16  # BlockSizeTokens: auto-tuned to the servers' KV block, vLLM's 16 (and the engines')
MAX_BLOCKS = 256  # DefaultMaxPrefixBlocks
DEFAULT_SERVER_BLOCKS = 31_250  # DefaultLRUCapacityPerServer, where a server's KV size is not known
_NO_ROWS = np.zeros(0, dtype=np.int64)


def blocks(tokens: int) -> int:
    """Whole blocks llm-d hashes of a prompt's first `tokens` tokens (a partial last block is ignored)."""
    return min(tokens // BLOCK_TOKENS, MAX_BLOCKS)


class _Holders:
    """The servers one chain element was sent to and how far along it each was sent, kept as arrays."""

    def __init__(self) -> None:
        self.position: dict[str, int] = {}
        self.servers: list[str] = []
        self.sent = np.zeros(4, dtype=np.int64)
        self._rows = _NO_ROWS  # servers' snapshot rows (-1: not in it), valid while _rows_for holds
        self._rows_for = (-1, -1, -1)  # (snapshot epoch, its membership, this element's changes)
        self._changes = 0
        # The arrays' addresses for the compiled walk, taken when they are (re)allocated: numpy takes
        # about a microsecond to tell one.
        self.sent_address: int = self.sent.ctypes.data
        self._rows_address: int = self._rows.ctypes.data

    def __len__(self) -> int:
        return len(self.servers)

    def get(self, server: str) -> int | None:
        at = self.position.get(server)
        return None if at is None else int(self.sent[at])

    def set(self, server: str, sent: int) -> None:
        at = self.position.get(server)
        if at is None:
            at = self.position[server] = len(self.servers)
            self.servers.append(server)
            if at == self.sent.size:
                self.sent = np.concatenate((self.sent, np.zeros(at, dtype=np.int64)))
                self.sent_address = self.sent.ctypes.data
            self._changes += 1
        self.sent[at] = sent

    def remove(self, server: str) -> None:
        at = self.position.pop(server)
        last = self.servers.pop()
        if last != server:  # the last one fills the hole
            self.servers[at] = last
            self.position[last] = at
            self.sent[at] = self.sent[len(self.servers)]
        self._changes += 1

    def rows(self, snapshot: ClusterSnapshot) -> np.ndarray:
        """Each server's row in snapshot, -1 for one not in it."""
        key = (snapshot.epoch, snapshot.membership, self._changes)
        if key != self._rows_for:
            row_of = snapshot.row_of
            self._rows = np.array([row_of.get(s, -1) for s in self.servers], dtype=np.int64)
            self._rows_address = self._rows.ctypes.data
            self._rows_for = key
        return self._rows

    def rows_address(self, snapshot: ClusterSnapshot) -> int:
        """The address of rows(snapshot)."""
        self.rows(snapshot)
        return self._rows_address


class LlmDPrefixIndex:
    """The approximate prefix index: match() for a request's scores, add() once it is placed."""

    def __init__(self, server_blocks: Callable[[str], int] | None = None) -> None:
        """server_blocks: a server's KV blocks (llm-d's auto-tuned LRU capacity) at the time it is sent a
        request; None: DEFAULT_SERVER_BLOCKS for every server."""
        self._server_blocks = server_blocks
        self._holders: dict[int, _Holders] = {}  # chain element -> the servers it was sent to
        # server -> entry -> its blocks, most recent last; an entry is a chain element, or (n,) for the
        # n-th run of orphaned blocks (no element names them any more)
        self._lru: dict[str, OrderedDict[int | tuple[int], int]] = {}
        self._used: dict[str, int] = {}  # server -> blocks in its LRU
        self._orphans = 0

    def match(self, snapshot: ClusterSnapshot, query: PickQuery) -> tuple[np.ndarray, np.ndarray, int]:
        """(rows, their blocks of the prompt, the prompt's blocks): each snapshot row whose server holds
        some of the prompt, once; a row's score is its blocks over the prompt's. No rows where the prompt
        has no whole block or no server holds its first."""
        prompt = query.prompt_estimate()
        total = blocks(prompt)
        if total == 0:
            return _NO_ROWS, _NO_ROWS, 0
        found: list[tuple[np.ndarray, np.ndarray]] = []
        for i, element in enumerate(query.prefix_chain):
            holders = self._holders.get(element)
            if holders is None:
                break  # no server holds the next block: the walk ends
            end = min(query.prefix_tokens(i + 1), prompt)
            held = np.minimum(holders.sent[: len(holders)], end) // BLOCK_TOKENS
            np.minimum(held, MAX_BLOCKS, out=held)
            found.append((holders.rows(snapshot), held))
            if int(held.max()) < blocks(end):
                break  # no server holds the rest of this element, so none holds what follows it
        if not found:
            return _NO_ROWS, _NO_ROWS, total
        if len(found) == 1:
            rows, held = found[0]
        else:  # a server's match is the deepest element it holds: the last one found
            found.reverse()
            rows, first = np.unique(np.concatenate([pair[0] for pair in found]), return_index=True)
            held = np.concatenate([pair[1] for pair in found])[first]
        keep = (rows >= 0) & (held > 0)
        return rows[keep], held[keep], total

    def chain(self, snapshot: ClusterSnapshot, query: PickQuery) -> tuple[int, list[int]]:
        """match() as the compiled walk takes it (sim/csrc/prefix_load.c): (the prompt's blocks, and for
        each chain element the index knows, in order up to the first it does not, the address of its
        servers' rows, the address of how far each was sent, how many servers, and where the element
        ends in the prompt, flattened). The walk itself ends where match() does. (0, []) where the
        prompt has no whole block."""
        prompt = query.prompt_estimate()
        total = blocks(prompt)
        if total == 0:
            return 0, []
        flat: list[int] = []
        for i, element in enumerate(query.prefix_chain):
            holders = self._holders.get(element)
            if holders is None:
                break
            end = min(query.prefix_tokens(i + 1), prompt)
            flat += (holders.rows_address(snapshot), holders.sent_address, len(holders), end)
        return total, flat

    def held(self, snapshot: ClusterSnapshot, query: PickQuery) -> dict[str, int]:
        """{server: blocks of the prompt it holds} over the servers in snapshot (match by node id)."""
        rows, held, _ = self.match(snapshot, query)
        ids = snapshot.node_ids
        return {str(ids[row]): int(b) for row, b in zip(rows.tolist(), held.tolist(), strict=True)}

    def add(self, query: PickQuery, server: str) -> None:
        """The request was sent to server: every block of its prompt is now in server's LRU."""
        chain = query.prefix_chain
        if not chain:
            return
        prompt = query.prompt_estimate()
        lru = self._lru.setdefault(server, OrderedDict())
        used = self._used.get(server, 0)
        start = 0  # blocks before the element
        for i, element in enumerate(chain):
            last = i == len(chain) - 1
            end = prompt if last else min(query.prefix_tokens(i + 1), prompt)
            holders = self._holders.get(element)
            if holders is None:
                holders = self._holders[element] = _Holders()
            before = holders.get(server)
            if before is not None and last and before > query.prefix_tokens(i + 1):
                # The earlier prompt went on past where this one parts from it: its own blocks stay.
                orphan = blocks(before) - blocks(query.prefix_tokens(i + 1))
                if orphan > 0:
                    self._orphans += 1
                    lru[(self._orphans,)] = orphan
                    used += orphan
            used -= lru.pop(element, 0)
            holders.set(server, end)
            size = max(blocks(end) - start, 0)
            lru[element] = size
            used += size
            start = max(start, blocks(end))
        capacity = self._server_blocks(server) if self._server_blocks is not None else DEFAULT_SERVER_BLOCKS
        while used > capacity and lru:
            entry, size = lru.popitem(last=False)
            used -= size
            if isinstance(entry, int):
                holders = self._holders[entry]
                holders.remove(server)
                if not len(holders):
                    del self._holders[entry]
        self._used[server] = used
