"""The placer's replica planner over the simulated fleet, and the workers following it.

As services/placer/app.py's planning loop runs it: every PLANNER_INTERVAL_S the last window's picks per
model are the demand (the placer's DemandCounter counts every pick), plan_replicas (the placer's own
code) decides what each healthy node should hold, and each node whose models should change gets that
set for three intervals (the Redis key's TTL), which every heartbeat reply in that time carries as
directives(desired, resident); the workers follow them as sim/worker_loads.py describes.

A replica's capacity: the placer takes one figure for every model (replica_capacity_rps) or one a model
(model_capacity_rps). The simulation sets each model's from what the requests picked for it so far cost,
in GPU-seconds at the profile's best efficiency (prompt tokens' compute plus each output token's share of
a 128-row step, as Simulation.offered_load counts work), at a target utilisation of 0.7: what an
operator would configure from the same fleet's measurements. A model not picked yet is left as it is.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from services.placer.cluster.state import ClusterState
from services.placer.config import PlacerSettings
from services.placer.placement import directives, plan_replicas
from sim.engine_model import GpuEngine
from sim.profiles import GpuProfile
from sim.request import Request
from sim.worker_loads import WorkerLoads

PLANNER_INTERVAL_S = PlacerSettings.planner_interval_s
DIRECTIVE_TTL_S = 3 * PLANNER_INTERVAL_S  # the placement key's TTL (app.py: ttl_s=3 * interval)
TARGET_UTILISATION = 0.7
_REFERENCE_ROWS, _REFERENCE_CONTEXT = 128, 2000  # the full step a token's share is counted against


class ReplicaPlanner:
    def __init__(self, engines: list[GpuEngine], node_ids: list[str], profile: GpuProfile) -> None:
        self.engines = engines
        self.gpu_of = {node_id: g for g, node_id in enumerate(node_ids)}
        self.profile = profile
        self._picks: Counter[str] = Counter()
        self._work_s: defaultdict[str, float] = defaultdict(float)
        self._picked: Counter[str] = Counter()
        self.desired: dict[int, tuple[frozenset[str], float]] = {}  # gpu -> (models, until)
        self.directives_sent = 0

    def record_pick(self, request: Request) -> None:
        """Every pick counts as demand (the placer's DemandCounter), and its request's work toward the
        model's capacity (its prompt and output lengths are known here, so the figure is the mix picked,
        not the mix finished first, which short requests lead)."""
        self._picks[request.model] += 1
        cost = self.profile.model(request.model)
        work = request.prompt * cost.per_prefill_token_s
        if cost.embedding:
            work += cost.base_s
        else:
            rows, context = _REFERENCE_ROWS, _REFERENCE_CONTEXT
            step = cost.base_s + rows * cost.per_row_s + rows * context * cost.per_context_token_s
            work += request.output * step / rows
        self._work_s[request.model] += work
        self._picked[request.model] += 1

    def capacities(self) -> dict[str, float]:
        """Requests per second one replica of each model serves at the target utilisation."""
        work = self._work_s
        return {m: TARGET_UTILISATION * n / work[m] for m, n in self._picked.items() if work[m]}

    def plan(self, state: ClusterState, now: float) -> None:
        capacities = self.capacities()
        rates = {m: n / PLANNER_INTERVAL_S for m, n in self._picks.items() if m in capacities}
        self._picks.clear()
        plan = plan_replicas(state.snapshot, rates, PlacerSettings.replica_capacity_rps, now, capacities)
        until = now + DIRECTIVE_TTL_S
        for node_id in plan.changed:
            self.desired[self.gpu_of[node_id]] = (frozenset(plan.desired[node_id]), until)

    def follow(self, gpus: np.ndarray, when: np.ndarray, workers: WorkerLoads) -> None:
        """The heartbeat replies of gpus (beating at times when) that carry a directive, to their workers."""
        if not self.desired:
            return
        for g, now in zip(gpus.tolist(), when.tolist(), strict=True):
            entry = self.desired.get(g)
            if entry is None:
                continue
            models, until = entry
            if now >= until:
                del self.desired[g]
                continue
            loads, evicts = directives(set(models), set(self.engines[g].residency.resident))
            if loads or evicts:
                self.directives_sent += 1
                workers.reply(g, now, loads, evicts)

    def summary(self) -> dict[str, object]:
        return {"replica_capacity_rps": self.capacities(), "directives_sent": self.directives_sent}
