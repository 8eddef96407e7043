"""The HTTP front's place in the gateway's lifecycle: off when asked, a taken port failing the start
(not exiting the process), health 200 while serving."""

from __future__ import annotations

import socket

import httpx2
import pytest

from services.gateway.app import GatewayApp
from services.gateway.config import GatewaySettings

# Remote placement: nothing here contacts a placer or Redis.
BASE = {"port": 0, "placement": "remote", "drain_timeout_s": 0.5}


async def test_off_serves_no_http() -> None:
    app = GatewayApp(GatewaySettings(**BASE, http_port=None))  # type: ignore[arg-type]
    await app.start()
    try:
        assert app.http is None and app.http_address is None
    finally:
        await app.stop()


async def test_port_zero_picks_a_free_port_and_serves_health() -> None:
    app = GatewayApp(GatewaySettings(**BASE, http_port=0))  # type: ignore[arg-type]
    await app.start()
    try:
        host, port = app.http_address.rsplit(":", 1)  # type: ignore[union-attr]
        assert host == "127.0.0.1" and int(port) > 0
        async with httpx2.AsyncClient(base_url=f"http://{app.http_address}") as client:
            assert (await client.get("/health")).status_code == 200
    finally:
        await app.stop()


async def test_a_taken_port_fails_the_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = GatewayApp(GatewaySettings(**BASE, http_port=port))  # type: ignore[arg-type]
        with pytest.raises(OSError, match=f"cannot listen for HTTP on 127.0.0.1:{port}"):
            await app.start()
        await app.stop()
