"""`python deploy/healthcheck.py HOST:PORT [SERVICE]`: exit 0 when grpc.health.v1.Health/Check is SERVING.

Used by the compose healthchecks and by people. SERVICE "" (the default) asks about the whole server; a
name asks about that service (e.g. hanzo.placer.ClusterState: NOT_SERVING while the placer's view of
Redis is stale). Exit 1 for NOT_SERVING, an unknown service, or a server that does not answer within
--timeout seconds (Docker reserves exit code 2).
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str, timeout_s: float) -> bool:
    """True when `service` at `address` reports SERVING; prints what it found (errors to stderr)."""
    label = f"{address} {service or '(server)'}"
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as err:
            print(f"{label}: {err.code().name}: {err.details()}", file=sys.stderr)
            return False
    print(f"{label}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="HOST:PORT of a gRPC server")
    parser.add_argument("service", nargs="?", default="", help="health check name; empty = whole server")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    return 0 if check(args.address, args.service, args.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
