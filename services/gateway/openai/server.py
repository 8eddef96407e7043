"""The HTTP front's server: uvicorn serving the ASGI app as a task of the gateway's own event loop, so
HTTP requests call the request path directly (no process, thread or proxy hop in between)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp

from services.common.tasks import bounded

log = logging.getLogger(__name__)
_STARTUP_S = 10.0


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The gateway's service loop owns SIGINT/SIGTERM and stops this server in order (after gRPC's
        # health goes NOT_SERVING); uvicorn's own handlers would replace the loop's.
        yield


class HttpServer:
    """Serves app on host:port (0: a free port) from start() to stop(); address is known after start."""

    def __init__(self, app: ASGIApp, host: str, port: int, drain_timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.drain_timeout_s = drain_timeout_s
        config = uvicorn.Config(
            app,
            log_config=None,  # the process's logging, as configured by the service, not uvicorn's
            log_level="warning",  # its start and stop lines repeat the gateway's own
            access_log=False,  # a log line per request costs more than the rest of a short one
            lifespan="off",
            timeout_graceful_shutdown=drain_timeout_s,  # type: ignore[arg-type]  # a float is fine
            server_header=False,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None
        self.address: str | None = None

    async def start(self) -> None:
        """Bind (OSError naming the address if taken) and serve; returns once requests are accepted."""
        sock = _bind(self.host, self.port)
        self.address = f"{self.host}:{sock.getsockname()[1]}"
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http-front")
        loop = asyncio.get_running_loop()
        give_up = loop.time() + _STARTUP_S
        # uvicorn says it started only through this flag; starting takes a few ms (no lifespan).
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError(f"the HTTP front on {self.address} stopped while starting")
            if loop.time() > give_up:
                raise RuntimeError(f"the HTTP front on {self.address} did not start in {_STARTUP_S} s")
            await asyncio.sleep(0.005)
        log.info("OpenAI-compatible HTTP front on http://%s", self.address)

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests and streams finish (drain_timeout_s, then they are
        cancelled, which cancels their worker streams), close the connections."""
        if self._task is None:
            return
        self._server.should_exit = True
        await bounded(self._task, "the HTTP front's shutdown", self.drain_timeout_s + 2.0)
        self._task = None


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port; bound here so the port is known at once and a taken port
    fails the gateway's start with OSError, not uvicorn's sys.exit inside a task."""
    bare = host.strip("[]")
    infos = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise OSError(err.errno, f"cannot listen for HTTP on {host}:{port}: {err.strerror}") from None
    sock.setblocking(False)
    return sock
