"""The options the mesh's internal gRPC connections share.

Keepalive is how a caller finds out that a peer has hung (SIGSTOP, a wedged host, a cut network) rather
than died: the kernel of a stopped process still holds its sockets open, so no call fails until HTTP/2
PINGs go unanswered. Clients ping every keepalive_s and give up on the connection keepalive_s later,
which fails every call on it with UNAVAILABLE. Servers must accept pings that often (gRPC's default
refuses pings closer than five minutes apart and answers them with GOAWAY), hence SERVER_OPTIONS.

Reconnect backoff: gRPC's own grows to 120 s; a caller that should find a restarted peer on its next
beat caps it at that beat's interval.
"""

from __future__ import annotations

import grpc

Options = list[tuple[str, int]]

# Every server: accept keepalive pings down to one a second, with or without calls in flight.
SERVER_OPTIONS: Options = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),  # 0: never close a connection for pinging too often
]


def keepalive_options(keepalive_s: float) -> Options:
    """Ping every keepalive_s (at least one second, what servers accept) and drop the connection when a
    ping goes unanswered for as long, idle or not."""
    every_ms = max(1000, int(keepalive_s * 1000))
    return [
        ("grpc.keepalive_time_ms", every_ms),
        ("grpc.keepalive_timeout_ms", every_ms),
        # gRPC core (1.6x on) times an unanswered PING with this, default 60 s, not with the keepalive
        # timeout alone: without it a hung peer is noticed after a minute.
        ("grpc.http2.ping_timeout_ms", every_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # 0: keep pinging a peer that sends nothing back
    ]


def reconnect_options(backoff_s: float) -> Options:
    """Reconnect attempts at most backoff_s apart (gRPC's default grows to 120 s)."""
    backoff_ms = max(1, int(backoff_s * 1000))
    return [("grpc.initial_reconnect_backoff_ms", backoff_ms), ("grpc.max_reconnect_backoff_ms", backoff_ms)]


def internal_channel(
    address: str,
    keepalive_s: float | None = None,
    reconnect_backoff_s: float | None = None,
) -> grpc.aio.Channel:
    """A channel to another service of the mesh, with keepalive and a reconnect cap where given."""
    options: Options = []
    if keepalive_s is not None:
        options += keepalive_options(keepalive_s)
    if reconnect_backoff_s is not None:
        options += reconnect_options(reconnect_backoff_s)
    return grpc.aio.insecure_channel(address, options=options)
