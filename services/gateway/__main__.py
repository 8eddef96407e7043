"""`python -m services.gateway`: the public endpoint, until SIGINT/SIGTERM (HANZO_GATEWAY_* env)."""

from __future__ import annotations

from services.common.service_main import run
from services.gateway.app import GatewayApp
from services.gateway.config import GatewaySettings

if __name__ == "__main__":
    run(
        lambda: GatewayApp(GatewaySettings.from_env()),
        lambda app: (
            f"GATEWAY_READY address={app.address} metrics_port={app.metrics_port} "
            f"http_address={app.http_address}"
        ),
    )
