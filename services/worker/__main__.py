"""`python -m services.worker`: serve this worker's models until SIGINT/SIGTERM (HANZO_WORKER_* env)."""

from __future__ import annotations

import asyncio
import logging
import signal

from services.worker.server.app import WorkerApp
from services.worker.server.config import WorkerSettings


async def serve(settings: WorkerSettings) -> None:
    app = WorkerApp(settings)
    await app.start()
    # One machine-readable line, so launchers and tests learn the ports that port 0 picked.
    print(
        f"WORKER_READY address={app.address} node_id={app.node_id} metrics_port={app.metrics_port}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await app.stop()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(WorkerSettings.from_env()))


if __name__ == "__main__":
    main()
