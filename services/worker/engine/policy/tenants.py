"""Fair sharing between tenants of one priority level, by tokens served (start-time fair queuing)."""

from __future__ import annotations

from collections import defaultdict


class TenantLedger:
    """Tokens computed per (priority level, tenant).

    A tenant that goes idle and comes back starts from the smallest count among the tenants still
    waiting, not from its old (low) count: otherwise a tenant that sat out an hour could then hold the
    engine for an hour. Counts only grow, so a float per tenant is all the state there is.
    """

    def __init__(self) -> None:
        self._served: dict[int, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))

    def served(self, level: int, tenant: str) -> float:
        """Tokens charged to tenant at level (after any catch-up on re-activation)."""
        return self._served[level][tenant]

    def activate(self, level: int, tenant: str, waiting_tenants: list[str]) -> None:
        """tenant starts waiting at level while waiting_tenants already wait there: catch its count up."""
        if not waiting_tenants:
            return
        ledger = self._served[level]
        floor = min(ledger[t] for t in waiting_tenants)
        if ledger[tenant] < floor:
            ledger[tenant] = floor

    def charge(self, level: int, tenant: str, tokens: int) -> None:
        """Add tokens computed for tenant's request at level."""
        self._served[level][tenant] += tokens
