"""deploy/healthcheck.py run as a subprocess against a real gRPC health server on a free loopback port."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.deploy.manifests import DEPLOY


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    """A gRPC server on a free loopback port with only the health service; the whole server SERVING."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(None)


def run_healthcheck(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEPLOY / "healthcheck.py"), *args, "--timeout", "2"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_healthcheck_passes_when_serving(health_server: tuple[str, health.HealthServicer]) -> None:
    address, _ = health_server
    result = run_healthcheck(address)
    assert result.returncode == 0, result.stderr
    assert "SERVING" in result.stdout


def test_healthcheck_fails_when_not_serving(health_server: tuple[str, health.HealthServicer]) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    result = run_healthcheck(address)
    assert result.returncode == 1
    assert "NOT_SERVING" in result.stdout


def test_healthcheck_asks_about_a_named_service(health_server: tuple[str, health.HealthServicer]) -> None:
    address, servicer = health_server
    assert run_healthcheck(address, "hanzo.placer.ClusterState").returncode == 1  # unknown: NOT_FOUND
    servicer.set("hanzo.placer.ClusterState", health_pb2.HealthCheckResponse.SERVING)
    assert run_healthcheck(address, "hanzo.placer.ClusterState").returncode == 0


def test_healthcheck_fails_when_nothing_listens() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")  # a port that was free, closed again unused
    server.stop(None)
    result = run_healthcheck(f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr or "DEADLINE_EXCEEDED" in result.stderr
