"""A real worker app on loopback for the server tests, with no placer: its heartbeats fail quietly
against a socket nobody serves."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from hanzo.inference.v1 import worker_pb2_grpc
from services.worker.server.app import WorkerApp
from services.worker.server.config import WorkerSettings


def no_placer(tmp_path: Path) -> str:
    """A placer address where nothing listens."""
    return f"unix:{tmp_path}/no-placer.sock"


@contextlib.asynccontextmanager
async def serving(settings: WorkerSettings) -> AsyncIterator[tuple[WorkerApp, worker_pb2_grpc.WorkerStub]]:
    """The started app and a stub on its address; stopped (drained) on exit."""
    app = WorkerApp(settings)
    await app.start()
    channel = grpc.aio.insecure_channel(app.address)
    try:
        yield app, worker_pb2_grpc.WorkerStub(channel)
    finally:
        await channel.close()
        await app.stop()
