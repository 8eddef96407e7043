"""`python -m services.telemetry`: the node's telemetry agent, configured by HANZO_TELEMETRY_* env vars."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from prometheus_client import start_http_server

from services.common.parent_death import die_with_launcher
from services.telemetry.config import SettingsError, TelemetrySettings
from services.telemetry.dcgm_metrics import DcgmMetrics, MeteredSource
from services.telemetry.load_probe import PlacerLoadProbe
from services.telemetry.simulated_source import SimulatedSource
from services.telemetry.sources import SourceUnavailableError, open_source
from services.telemetry.streamer import TelemetryStreamer

logger = logging.getLogger("services.telemetry")


async def serve(settings: TelemetrySettings) -> None:
    """Run the agent until SIGINT or SIGTERM, then close the stream, the probe and the source."""
    probe = PlacerLoadProbe(
        settings.node_id, settings.placer_address, settings.probe, settings.internal_token
    )
    # NVML initialisation blocks; keep it off the loop like every other NVML call.
    try:
        source = await asyncio.to_thread(open_source, settings, probe.utilization)
    except BaseException:
        await probe.close()
        raise
    simulated = isinstance(source, SimulatedSource)
    metrics = DcgmMetrics(settings.hostname, settings.node_id)
    http = None
    if settings.metrics_port is not None:
        http, _ = start_http_server(settings.metrics_port, registry=metrics.registry)
    metrics_port = None if http is None else http.server_port
    streamer = TelemetryStreamer(
        MeteredSource(source, metrics),
        settings.node_id,
        settings.placer_address,
        settings.stream,
        internal_token=settings.internal_token,
    )

    def stop() -> None:
        logger.info("stopping telemetry agent")
        streamer.stop()
        probe.stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    tasks = [asyncio.create_task(streamer.run(), name="telemetry-streamer")]
    kind = "simulated" if simulated else "nvml"
    # One machine-readable line for launchers and tests.
    print(f"TELEMETRY_READY node_id={settings.node_id} source={kind} metrics_port={metrics_port}", flush=True)
    if simulated:
        tasks.append(asyncio.create_task(probe.run(), name="telemetry-load-probe"))
    else:
        await probe.close()  # real NVML utilisation needs no load input
    try:
        await asyncio.gather(*tasks)
    finally:
        await asyncio.to_thread(source.close)
        if http is not None:
            http.shutdown()
    logger.info(
        "telemetry agent stopped after %d samples, %d reconnects", streamer.samples_sent, streamer.reconnects
    )


def main() -> int:
    die_with_launcher()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = TelemetrySettings.from_env()
    except SettingsError as err:
        logger.error("bad telemetry settings: %s", err)
        return 2
    # repr, not asdict: repr leaves out the internal token (a repr=False field), asdict would log it.
    logger.info("telemetry settings: %r", settings)
    try:
        asyncio.run(serve(settings))
    except SourceUnavailableError as err:
        logger.error("%s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
