"""Per-model request demand: counted locally per pick, merged across placers in Redis per time window."""

from __future__ import annotations

from collections import Counter

from services.placer.cluster.store import ClusterStore


class DemandCounter:
    """Picks per model since the last flush (this placer only)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def record(self, model: str) -> None:
        self._counts[model] += 1

    async def flush(self, store: ClusterStore, now_s: float, window_s: float) -> None:
        """Add the local counts to the shared window that now_s falls in; keeps them if Redis fails."""
        if not self._counts:
            return
        counts, self._counts = self._counts, Counter()
        try:
            await store.add_demand(int(now_s // window_s), counts, ttl_s=4 * window_s)
        except Exception:
            self._counts.update(counts)  # not lost: the next flush retries
            raise


async def demand_rates(store: ClusterStore, now_s: float, window_s: float) -> dict[str, float]:
    """Requests per second per model over the last complete window, from every placer."""
    counts = await store.read_demand(int(now_s // window_s) - 1)
    return {model: count / window_s for model, count in counts.items()}
