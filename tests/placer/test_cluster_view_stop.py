"""The placer's cluster view stops when asked, even when redis-py turns the cancellation into a Redis
error: a retry loop that took it for an outage would run on and hang the service's graceful stop (seen
as a placer that ignored SIGTERM, once in a few full test runs). Real Redis; the one stand-in is the
subscription, which raises the error redis-py raises when a cancel lands mid-command (that cannot be
triggered on demand)."""

from __future__ import annotations

import asyncio

from redis.exceptions import ConnectionError as RedisConnectionError

from services.placer.cluster.schema import Keys
from services.placer.cluster.store import ClusterStore
from services.placer.cluster.view import ClusterView, SyncSettings


async def cancel_surfacing_as_connection_error() -> None:
    """Stands in for ClusterView._listen inside redis-py: waits for events; a cancel comes out as the
    connection error redis-py raises when its socket is closed under a command."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        raise RedisConnectionError("Connection closed by server.") from None


async def test_stop_ends_the_event_loop_when_redis_py_swallows_the_cancel(redis_server) -> None:
    store = ClusterStore(redis_server.url, Keys("stop-test"))
    view = ClusterView(store, SyncSettings(resync_interval_s=0.05, backoff_initial_s=0.01))
    view._listen = cancel_surfacing_as_connection_error  # type: ignore[method-assign]
    await view.start()
    tasks = list(view._tasks)
    await asyncio.sleep(0.1)  # both loops running: resyncs against the real Redis, the stand-in listening
    await view.stop()
    assert all(task.done() for task in tasks), "a background task outlived stop()"
    await store.close()
