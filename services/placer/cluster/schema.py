"""Redis schema of the cluster state. Every placer replica reads and writes it; none owns it.

    {prefix}:node:{node_id}      STRING  NodeEntry (protobuf): last heartbeat + deadline. PX = node TTL,
                                         about 3 heartbeat intervals, so a dead node vanishes by itself.
    {prefix}:thermal:{node_id}   STRING  ThermalEntry (protobuf): last GPU sample + trend. PX = node TTL.
    {prefix}:nodes               ZSET    node_id scored by deadline: the index a resync reads (one
                                         ZRANGEBYSCORE + MGET instead of a SCAN); entries past their
                                         deadline are pruned on resync.
    {prefix}:events              PUBSUB  ClusterEvent (protobuf) after each write: a hint so replicas
                                         update without a read; the periodic resync repairs anything lost.
    {prefix}:demand:{window}     ZSET    model -> requests counted in that time window by all placers
                                         (ZINCRBY from each); expires after a few windows.
    {prefix}:placement:{node_id} STRING  JSON list of model names the planner wants resident there.
    {prefix}:planner-lock        STRING  lease (SET NX PX) of the replica planning leader.

Every write is idempotent: a heartbeat rewrites the whole entry, so after a Redis flush or restart the
cluster is whole again within one heartbeat interval.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix; two meshes can share a Redis with different prefixes."""

    prefix: str = "hanzo"

    def node(self, node_id: str) -> str:
        return f"{self.prefix}:node:{node_id}"

    def thermal(self, node_id: str) -> str:
        return f"{self.prefix}:thermal:{node_id}"

    def placement(self, node_id: str) -> str:
        return f"{self.prefix}:placement:{node_id}"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"

    def demand(self, window: int) -> str:
        return f"{self.prefix}:demand:{window}"

    @property
    def planner_lock(self) -> str:
        return f"{self.prefix}:planner-lock"
