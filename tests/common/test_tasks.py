"""Bounded stops: a task that will not stop cannot hang a graceful shutdown."""

from __future__ import annotations

import asyncio
import time

from services.common.tasks import bounded, cancel_and_wait


async def test_cancel_and_wait_stops_tasks_and_leaves_a_stuck_one_behind() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # like a socket close that never completes

    async def failing() -> None:
        raise RuntimeError("boom")

    polite = asyncio.create_task(asyncio.Event().wait())
    stuck = asyncio.create_task(stubborn())
    broken = asyncio.create_task(failing())
    await asyncio.sleep(0)  # let them start
    started = time.monotonic()
    await cancel_and_wait([polite, stuck, broken], timeout_s=0.2)
    assert time.monotonic() - started < 2.0
    assert polite.cancelled() and broken.done() and not stuck.done()
    release.set()
    await stuck


async def test_bounded_moves_on_after_its_timeout() -> None:
    started = time.monotonic()
    await bounded(asyncio.Event().wait(), "a close that never ends", timeout_s=0.1)
    assert time.monotonic() - started < 2.0
