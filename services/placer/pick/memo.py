"""What a Picker carries from one pick to the next: the node each prompt prefix was last sent to, and the
random draws that break ties. Their own pieces, so a policy built beside the Picker (the simulator's
prefix + load) remembers and draws exactly as the Picker does."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from services.placer.cluster.snapshot import ClusterSnapshot


class PrefixMemo:
    """Prefix hash -> the node id it was last sent to, the least recent forgotten past capacity. A
    prompt's hashes are its prefix chain (query.py): each names the prompt up to the end of one of its
    blocks, so the deepest one remembered names the longest prefix some node was last sent."""

    def __init__(self, capacity: int) -> None:
        """capacity: hashes remembered, a prompt's chain counting each of its elements; raises ValueError
        for a negative capacity (0 remembers nothing)."""
        if capacity < 0:
            raise ValueError(f"prefix_capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._nodes: OrderedDict[int, str] = OrderedDict()  # most recent last

    def row(self, snapshot: ClusterSnapshot, chain: tuple[int, ...]) -> int | None:
        """Row of the node that was last sent the longest prefix of chain's prompt, among the nodes still
        in the snapshot; None if it shares no remembered prefix with one."""
        return self.match(snapshot, chain)[0]

    def match(self, snapshot: ClusterSnapshot, chain: tuple[int, ...]) -> tuple[int | None, int]:
        """(row as row() finds it, how many of chain's elements that prefix spans; 0 with None)."""
        for depth in range(len(chain), 0, -1):
            node_id = self._nodes.get(chain[depth - 1])
            if node_id is not None:
                row = snapshot.row_of.get(node_id)
                if row is not None:
                    return row, depth
        return None, 0

    def remember(self, chain: tuple[int, ...], node_id: str) -> None:
        """Every prefix of the prompt as sent to node_id: a later prompt extending any of them (the next
        turn, or another session opening with the same tools) finds where it went."""
        if self._capacity == 0:
            return
        nodes = self._nodes
        for prefix in chain:
            nodes[prefix] = node_id
            nodes.move_to_end(prefix)
        while len(nodes) > self._capacity:
            nodes.popitem(last=False)


class TieBreak:
    """Uniform indices from one random stream, drawn in batches: a numpy call per tie is slow."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._uniforms: list[float] = []

    def draw(self, n: int) -> int:
        """A uniform index in [0, n)."""
        uniform = self.next_uniform()
        self._uniforms.pop()
        return min(int(uniform * n), n - 1)

    def next_uniform(self) -> float:
        """The uniform the next draw takes, left for it: a compiled ranking draws min(int(u x n), n - 1)
        itself and then calls take()."""
        if not self._uniforms:
            self._uniforms = self._rng.random(1024).tolist()
        return self._uniforms[-1]

    def take(self) -> None:
        """Use up next_uniform()'s value."""
        self._uniforms.pop()
