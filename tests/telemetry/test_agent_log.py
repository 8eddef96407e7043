"""The agent's start log names its settings but not the mesh's internal token (a secret every service
shares): a real `python -m services.telemetry` process, its log read after it stopped."""

from __future__ import annotations

from pathlib import Path

from services.common.internal_auth import ENV as INTERNAL_TOKEN_ENV
from services.common.redis_server import free_port
from services.mesh.process import start_service

TOKEN = "agent-log-internal-token"


def test_the_settings_log_leaves_out_the_internal_token(tmp_path: Path) -> None:
    env = {
        INTERNAL_TOKEN_ENV: TOKEN,
        "HANZO_TELEMETRY_NODE_ID": "log-node",
        # Nothing listens there: the agent logs its settings and starts whether or not a placer answers.
        "HANZO_TELEMETRY_PLACER_ADDRESS": f"127.0.0.1:{free_port()}",
        "HANZO_TELEMETRY_SOURCE": "simulated",
    }
    agent = start_service("telemetry", "services.telemetry", env, "TELEMETRY_READY", tmp_path / "agent.log")
    assert agent.stop() == 0
    log = agent.log_text()
    assert "telemetry settings: TelemetrySettings(node_id='log-node'" in log
    assert TOKEN not in log
