"""`python -m services.placer`: run one placer until SIGINT/SIGTERM. Settings: HANZO_PLACER_* env vars."""

from __future__ import annotations

from services.common.service_main import run
from services.placer.app import PlacerApp
from services.placer.config import PlacerSettings

if __name__ == "__main__":
    run(
        lambda: PlacerApp(PlacerSettings.from_env()),
        lambda app: f"PLACER_READY address={app.address} metrics_port={app.metrics_port}",
    )
