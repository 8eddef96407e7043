"""Which models one simulated worker holds, kept as services/worker/server/host.py keeps them.

Resident models (the least recently used evicted first), host copies of the evicted ones (a reload over
PCIe from pinned host memory instead of a read from disk: ModelCost.reload_s against load_s), and at most
one load at a time (the worker's host lock). The worker may load only its catalog, the models it was
started with. The arena is the GPU's memory less 10% (vLLM's 0.9 utilisation). The KV cache is elastic
here: it may grow into whatever the weights leave, and what it does not hold is free, so a load fits
where the weights and the KV in use leave room for it (else the worker's load with make_room evicts the
least recently used idle models first). The worker's own pools are sized at load and rebalanced between
its decoders; its free memory, which the placer reads, is the arena no partition holds, and with the
default pool size that is most of what the weights leave, as here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from sim.profiles import GpuProfile, ModelCost

if TYPE_CHECKING:
    from sim.request import Request


class Residency:
    def __init__(
        self, catalog: dict[str, ModelCost], arena_bytes: float, host_copies: Iterable[str] = ()
    ) -> None:
        """catalog: every model the worker may serve, resident at the start but for host_copies, whose
        weights it starts with in host memory only (a GPU that served them before)."""
        self.catalog = catalog
        self.arena_bytes = arena_bytes
        self.host_copies: set[str] = set(host_copies)
        self.resident: dict[str, None] = dict.fromkeys(m for m in catalog if m not in self.host_copies)
        # When a request last named each model (the engine writes it on every enqueue: a dict write is
        # all the hot path pays); eviction takes the least recently used.
        self.last_used: dict[str, float] = {}
        self.loading: str | None = None
        self.version = 0  # bumped whenever what a heartbeat reports of the models changes
        self.evictions = 0
        self._weights: tuple[int, int] = (-1, 0)  # (version, weight_bytes() of what is held)

    def holding(self) -> list[str]:
        """Resident models and the one loading (its partition is taken when the load starts)."""
        return [*self.resident, *([self.loading] if self.loading else [])]

    def weight_bytes(self, models: Iterable[str] | None = None) -> int:
        """Of the models held (cached: every heartbeat asks), or of those given."""
        if models is None:
            if self._weights[0] != self.version:
                self._weights = (self.version, self.weight_bytes(self.holding()))
            return self._weights[1]
        return sum(self.catalog[m].weight_bytes for m in models)

    def free_bytes(self, kv_bytes: float, models: Iterable[str] | None = None) -> int:
        """Arena bytes neither weights (of the models held, or of those given) nor KV in use hold."""
        return max(int(self.arena_bytes - self.weight_bytes(models) - kv_bytes), 0)

    def eviction_plan(self, model: str, kv_bytes: float, idle: Callable[[str], bool]) -> list[str] | None:
        """The least recently used idle models to evict so that model fits beside kv_bytes of KV in use
        ([] if it fits now), None if it would not even with every idle model gone (or a load is already
        running)."""
        if self.loading is not None:
            return None
        weight = self.catalog[model].weight_bytes
        kept, victims = list(self.holding()), []
        by_use = sorted(self.resident, key=lambda m: self.last_used.get(m, -1.0))  # stable: never used first
        for candidate in [m for m in by_use if idle(m)]:
            if self.free_bytes(kv_bytes, kept) >= weight:
                break
            kept.remove(candidate)
            victims.append(candidate)
        return victims if self.free_bytes(kv_bytes, kept) >= weight else None

    def start_load(self, model: str) -> float:
        """The load's seconds: from the host copy if there is one, else from disk."""
        cost = self.catalog[model]
        self.loading = model
        self.version += 1
        return cost.reload_s if model in self.host_copies else cost.load_s

    def finish_load(self) -> str:
        model = self.loading
        assert model is not None
        self.loading = None
        self.resident[model] = None
        self.host_copies.discard(model)  # resident again: the copy would only go stale
        self.version += 1
        return model

    def evict(self, model: str) -> None:
        del self.resident[model]
        self.host_copies.add(model)  # keep_host_copies, the worker's default
        self.version += 1
        self.evictions += 1


class ModelLifecycle:
    """GpuEngine's side of its models coming and going, as the worker follows the placer's directives
    (sim/planner.py): loads (first evicting idle models in the way) and evictions of idle models, each
    resizing the KV pool to what the weights leave.

    The engine's state it reads and writes is declared here, so that the methods type-check on their own
    class (and compile with sim/compiled.py, which cannot take a self annotated as the subclass)."""

    profile: GpuProfile
    residency: Residency
    last_used: dict[str, float]
    costs: dict[str, ModelCost]
    rows: dict[str, int]
    context: dict[str, float]
    waiting: tuple[deque[Request], ...]
    prefilling: list[Request]
    joining: list[Request]
    kv_used: float
    kv_bytes_per_token: int
    kv_capacity: int
    unweighted_bytes: float
    _decoder_cost: ModelCost | None

    @property
    def memory_free_bytes(self) -> int:
        return max(int(self.unweighted_bytes - self.kv_used * self.kv_bytes_per_token), 0)

    def idle(self, model: str) -> bool:
        """No request of model queued, prefilling or decoding: the worker evicts only such a model."""
        if self.rows.get(model):
            return False
        queued = (r for queue in (*self.waiting, self.prefilling, self.joining) for r in queue)
        return all(r.model != model for r in queued)

    def start_load(self, model: str) -> float | None:
        """Begin loading model, first evicting the idle models in its way; the load's seconds, or None when
        it cannot fit (or a load is running). Resident models keep serving meanwhile."""
        victims = self.residency.eviction_plan(model, self.kv_used * self.kv_bytes_per_token, self.idle)
        if victims is None:
            return None
        for victim in victims:
            self.evict(victim)
        seconds = self.residency.start_load(model)
        self._size_kv()
        return seconds

    def finish_load(self, now: float) -> str:
        model = self.residency.finish_load()
        self.last_used[model] = now  # just loaded: the most recently used
        self.costs[model] = self.residency.catalog[model]
        self.rows[model], self.context[model] = 0, 0.0
        self._size_kv()
        return model

    def evict(self, model: str) -> bool:
        """Evict an idle resident model (its weights kept on the host); False if it is busy."""
        if model not in self.costs or not self.idle(model):
            return False
        self.residency.evict(model)
        del self.costs[model], self.rows[model], self.context[model]
        self._size_kv()
        return True

    def _size_kv(self) -> None:
        """The KV pool: what the partitions' weights leave of the arena, in tokens of the largest
        decoder's KV; and the decoder whose costs the adaptive budget reads."""
        held = [self.residency.catalog[m] for m in self.residency.holding()]
        decoders = [c for c in held if not c.embedding]
        self.kv_bytes_per_token = kv_bytes = max((c.kv_bytes_per_token for c in decoders), default=1)
        weights = sum(c.weight_bytes for c in held)
        # What the weights leave, less 10% for activations and the allocator (vLLM's 0.9 utilisation).
        self.kv_capacity = max(int((self.profile.memory_bytes * 0.9 - weights) / kv_bytes), 0)
        self.unweighted_bytes = self.residency.arena_bytes - weights  # free but for the KV in use
        self._decoder_cost = decoders[0] if decoders else held[0] if held else None
