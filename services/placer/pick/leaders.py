"""Which rows lead a ranking: the best total, its ties and the runners-up, without sorting the fleet."""

from __future__ import annotations

import numpy as np

TIE_TOLERANCE = 1e-9


def rank_leaders(totals: np.ndarray, runners_up: int, finite: int, spread: float) -> tuple[np.ndarray, int]:
    """(rows, how many of them tie with the best, within TIE_TOLERANCE). More than runners_up ties: the
    ties, in row order. Otherwise the best runners_up + 1 rows by total, equal totals in row order (the
    ties come first).

    finite: how many totals are not -inf (rows that passed); spread: more than any two finite totals can
    differ. Ties are not sorted: in a cluster of identical idle nodes they can be every candidate. The
    runners-up come from a band below the best that widens until it holds enough rows, which at fleet
    scale reads a handful of rows where sorting would read them all.
    """
    best = totals.max()
    ties = np.flatnonzero(totals >= best - TIE_TOLERANCE)
    if ties.size > runners_up:
        return ties, int(ties.size)
    wanted = min(runners_up + 1, finite)
    band = 0.01
    near = np.flatnonzero(totals >= best - band)
    while near.size < wanted and band < 2 * spread:
        band *= 4
        near = np.flatnonzero(totals >= best - band)
    values = -totals[near]
    if near.size > 4 * wanted:  # a wide band at fleet scale: partition before sorting
        # Every row as good as the wanted-th stays, so that which of equal rows make it is not left to
        # the partition's order.
        kept = values <= np.partition(values, wanted - 1)[wanted - 1]
        near, values = near[kept], values[kept]
    # Best first, equal totals in row order (the compiled ranking's order too); ties sort first, as
    # every other total is lower by more than TIE_TOLERANCE.
    order = np.lexsort((near, values))
    return near[order][:wanted], int(ties.size)
