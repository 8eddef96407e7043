"""`python -m services.gateway`: the public endpoint, until SIGINT/SIGTERM (HANZO_GATEWAY_* env)."""

from __future__ import annotations

import asyncio
import logging
import signal

from services.gateway.app import GatewayApp
from services.gateway.config import GatewaySettings


async def serve(settings: GatewaySettings) -> None:
    app = GatewayApp(settings)
    await app.start()
    # One machine-readable line, so launchers and tests learn the ports that port 0 picked.
    print(f"GATEWAY_READY address={app.address} metrics_port={app.metrics_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await app.stop()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(GatewaySettings.from_env()))


if __name__ == "__main__":
    main()
