"""The `python -m services.X` lifecycle every service shares: start, announce readiness, wait for
SIGINT/SIGTERM, stop gracefully."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable
from typing import Protocol, TypeVar

from services.common.parent_death import die_with_launcher


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Service)

_YOUNG_GC_THRESHOLD = 20_000


async def serve(make_app: Callable[[], S], ready_line: Callable[[S], str]) -> None:
    """Build the app inside the event loop, start it, print its one readiness line, run until signalled."""
    # Handlers first: a launcher may signal as soon as it reads the readiness line, and a SIGTERM that
    # arrived before them would kill the process without a graceful stop.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    app = make_app()
    await app.start()
    # What start-up built (modules, models, servers) lives until exit: moved out of the collector's view,
    # full collections stop re-walking it on the request path.
    gc.freeze()
    # One machine-readable line, so launchers and tests learn the ports that port 0 picked.
    print(ready_line(app), flush=True)
    await stop.wait()
    await app.stop()


def tune_collector() -> None:
    """The young generation's threshold every service runs with (benches measuring a service's code in
    their own process call it too, to measure it as deployed)."""
    # Every streamed message allocates a few container objects; at the default threshold (700) the young
    # generation was collected every few requests, a tenth of the gateway's CPU. Cycles still get freed.
    gc.set_threshold(_YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])


def run(make_app: Callable[[], S], ready_line: Callable[[S], str]) -> None:
    """Entry point body of a service's __main__."""
    die_with_launcher()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_collector()
    asyncio.run(serve(make_app, ready_line))
