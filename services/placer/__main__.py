"""`python -m services.placer`: run one placer until SIGINT/SIGTERM. Settings: HANZO_PLACER_* env vars."""

from __future__ import annotations

import asyncio
import logging
import signal

from services.placer.app import PlacerApp
from services.placer.config import PlacerSettings


async def serve(settings: PlacerSettings) -> None:
    app = PlacerApp(settings)
    await app.start()
    # One machine-readable line, so scripts and tests learn the ports that port 0 picked.
    print(f"PLACER_READY address={app.address} metrics_port={app.metrics_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await app.stop()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(PlacerSettings.from_env()))


if __name__ == "__main__":
    main()
