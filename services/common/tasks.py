"""Stopping background tasks without hanging a graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable

log = logging.getLogger(__name__)

# redis-py's asyncio client can wait forever for a socket to close when a command is cancelled
# (redis/redis-py#3941): a stop waits this long for a task, then leaves it behind.
STOP_WAIT_S = 2.0


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object]], timeout_s: float = STOP_WAIT_S) -> None:
    """Cancel tasks and wait up to timeout_s for them to finish; those still running are logged and
    abandoned (their exceptions, cancellation included, are never raised here)."""
    pending = [task for task in tasks if not task.done()]
    for task in pending:
        task.cancel()
    if not pending:
        return
    done, stuck = await asyncio.wait(pending, timeout=timeout_s)
    for task in done:
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it as never retrieved
    for task in stuck:
        log.warning("task %s did not stop within %.1f s; leaving it behind", task.get_name(), timeout_s)


async def bounded(awaitable: Awaitable[object], what: str, timeout_s: float = STOP_WAIT_S) -> None:
    """Await a closing step for at most timeout_s; logs and moves on when it does not finish."""
    try:
        await asyncio.wait_for(awaitable, timeout_s)
    except TimeoutError:
        log.warning("%s did not finish within %.1f s; moving on", what, timeout_s)
