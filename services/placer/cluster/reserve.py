"""Where a node stands for the node reserve (pick/scorers.py, node_reserve): a rank from its id alone."""

from __future__ import annotations

import hashlib


def reserve_rank(node_id: str) -> float:
    """A node's place in [0, 1): a uniform hash of its id, so every placer replica, and every restart,
    reserves the same nodes, and a node keeps its place as others come and go."""
    digest = hashlib.blake2b(node_id.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)  # 53 bits: exact in a double, below 1
