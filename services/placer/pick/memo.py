"""What a Picker carries from one pick to the next: the node each prompt prefix was last sent to, and the
random draws that break ties. Their own pieces, so a policy built beside the Picker (the simulator's
prefix + load) remembers and draws exactly as the Picker does."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from services.placer.cluster.snapshot import ClusterSnapshot


class PrefixMemo:
    """prefix_hash -> the node id it was last sent to, the least recent forgotten past capacity."""

    def __init__(self, capacity: int) -> None:
        """Raises ValueError for a negative capacity (0 remembers nothing)."""
        if capacity < 0:
            raise ValueError(f"prefix_capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._nodes: OrderedDict[int, str] = OrderedDict()  # most recent last

    def row(self, snapshot: ClusterSnapshot, prefix_hash: int | None) -> int | None:
        """Row of the node that last served prefix_hash, if it is still in the snapshot."""
        if prefix_hash is None:
            return None
        node_id = self._nodes.get(prefix_hash)
        return None if node_id is None else snapshot.row_of.get(node_id)

    def remember(self, prefix_hash: int | None, node_id: str) -> None:
        if prefix_hash is None or self._capacity == 0:
            return
        self._nodes[prefix_hash] = node_id
        self._nodes.move_to_end(prefix_hash)
        if len(self._nodes) > self._capacity:
            self._nodes.popitem(last=False)


class TieBreak:
    """Uniform indices from one random stream, drawn in batches: a numpy call per tie is slow."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._uniforms: list[float] = []

    def draw(self, n: int) -> int:
        """A uniform index in [0, n)."""
        if not self._uniforms:
            self._uniforms = self._rng.random(1024).tolist()
        return min(int(self._uniforms.pop() * n), n - 1)
