"""The local stack's private redis-server as a service the Supervisor watches and restarts (see
supervise.py): on the same port, so every client's reconnect finds it, and empty (it runs with
`--save ""`: nothing persists), as a crashed cache comes back; the services write their state again."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from services.common.redis_server import RedisServer


class SupervisedRedis:
    """The parts of ChildProcess's interface that Supervisor uses, over a RedisServer."""

    name = "redis"
    module = "redis"
    ready_prefix = "+PONG"

    def __init__(self, server: RedisServer, log_path: Path) -> None:
        self.server = server
        self.log_path = log_path  # redis-server logs nowhere: its files live in this directory
        self.started_at = time.monotonic()
        self.ready = {"address": f"127.0.0.1:{server.port}"}

    @property
    def pid(self) -> int:
        return self.server.process.pid if self.server.process else 0

    def poll(self) -> int | None:
        return self.server.process.poll() if self.server.process else -1

    def check_ready(self) -> bool:
        return True  # respawn() returns once it answered PING

    def respawn(self, keep_ports: Mapping[str, str]) -> SupervisedRedis:
        """Start it again on its port (RedisServer.start waits for PING, within 10 s)."""
        self.server.start()
        self.started_at = time.monotonic()
        return self

    def kill(self) -> int:
        if self.server.process is None:
            return -1
        self.server.process.kill()
        return self.server.process.wait()
