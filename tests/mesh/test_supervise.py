"""The local stack's supervision (services/mesh/supervise.py) on real processes: a killed placer comes back
on its own port and serves, a service that keeps crashing is given up on and said so, and `hanzo-mesh
serve` keeps answering through a SIGKILLed worker that it restarts."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hanzo.inference.v1 import placer_pb2, placer_pb2_grpc
from services.common.internal_auth import ENV as INTERNAL_TOKEN_ENV
from services.common.internal_auth import HEADER
from services.common.redis_server import PASSWORD_ENV as REDIS_PASSWORD_ENV
from services.common.redis_server import RedisServer
from services.mesh.process import ChildProcess
from services.mesh.stack import KEEP_PORTS
from services.mesh.supervise import RestartPolicy, Supervisor
from tests.mesh.test_serve import served

FAST = RestartPolicy(first_delay_s=0.05, max_delay_s=0.2, max_restarts=3, window_s=60.0)


def supervise_until(supervisor: Supervisor, done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        supervisor.tick()
        time.sleep(0.05)  # the supervisor's own polling period, bounded by the deadline


@pytest.mark.parametrize(
    ("attempt", "delay"), [(1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0), (20, 30.0)]
)
def test_backoff_starts_under_a_second_and_doubles_to_its_cap(attempt: int, delay: float) -> None:
    assert RestartPolicy().delay_s(attempt) == delay


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_killed_placer_is_restarted_on_its_own_port(tmp_path: Path, redis_server: RedisServer) -> None:
    env = {
        "HANZO_PLACER_PORT": "0",
        "HANZO_PLACER_METRICS_PORT": "0",
        "HANZO_PLACER_REDIS_URL": redis_server.url,
    }
    tiers = [[ChildProcess("placer", "services.placer", env, "PLACER_READY", tmp_path / "placer.log")]]
    said: list[str] = []
    supervisor = Supervisor(tiers, KEEP_PORTS, FAST, said.append)
    try:
        first = tiers[0][0]
        address = first.wait_ready(60)["address"]
        first.kill()
        supervise_until(supervisor, lambda: tiers[0][0] is not first and bool(tiers[0][0].ready), 60, "back")
        again = tiers[0][0]
        assert again.ready["address"] == address and again.pid != first.pid
        assert serving(address)
        assert supervisor.restarts == {"placer": 1} and not supervisor.given_up
        assert any("placer exited with -9; restarting" in line for line in said), said
        assert any(line.startswith("placer is back") for line in said), said
    finally:
        for child in tiers[0]:
            child.stop(15)


def test_a_service_that_keeps_crashing_is_given_up_and_reported(tmp_path: Path) -> None:
    ghost = ChildProcess("ghost", "services.mesh.no_such_module", {}, "GHOST_READY", tmp_path / "g.log")
    said: list[str] = []
    supervisor = Supervisor([[ghost]], KEEP_PORTS, FAST, said.append)
    supervise_until(supervisor, lambda: bool(supervisor.given_up), 60, "given up")
    assert supervisor.given_up == ["ghost"] and supervisor.restarts == {"ghost": FAST.max_restarts}
    assert re.search(r"ghost exited with 1 after 3 restarts .*not restarting it", said[-1]), said


def test_serve_answers_again_after_its_worker_is_killed(tmp_path: Path, llama_gqa_dir: Path) -> None:
    openai = pytest.importorskip("openai")
    argv = [str(llama_gqa_dir), "--name", "tiny", "--port", "0", "--http-port", "0", "--max-model-len", "512"]
    with served(tmp_path, *argv) as lines:
        out = (tmp_path / "serve.out").read_text()
        worker_pid = int(re.search(r"^worker-1\s+(\d+)", out, re.M).group(1))  # type: ignore[union-attr]
        client = openai.OpenAI(base_url=lines["openai"], api_key=lines["api key"], max_retries=0, timeout=60)

        def answer() -> int:
            reply = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=4)
            return reply.usage.completion_tokens

        assert answer() >= 1
        os.kill(worker_pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while "worker-1 is back" not in (tmp_path / "serve.out").read_text():
            assert time.monotonic() < deadline, (tmp_path / "serve.out").read_text()[-3000:]
            time.sleep(0.2)  # reading the CLI's output: it gives no other signal
        # Back and registered again: the placer offers it once its heartbeat lands (within seconds).
        while True:
            try:
                assert answer() >= 1
                break
            except (openai.APIStatusError, openai.APIConnectionError):
                assert time.monotonic() < deadline, "the restarted worker never took traffic"
                time.sleep(0.2)


def test_serve_rebuilds_its_view_after_redis_is_killed(
    tmp_path: Path, llama_gqa_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis SIGKILLed: picks go on from the last snapshot while it is gone; restarted empty on its
    port with the same password, the placer and the worker's heartbeats write the cluster state again
    within seconds. Only a client with the password reads it."""
    openai = pytest.importorskip("openai")
    import redis
    from redis.backoff import NoBackoff
    from redis.exceptions import AuthenticationError
    from redis.retry import Retry

    password = "supervised-redis-password"
    monkeypatch.setenv(REDIS_PASSWORD_ENV, password)  # serve takes it instead of making one
    argv = [str(llama_gqa_dir), "--name", "tiny", "--port", "0", "--http-port", "0", "--max-model-len", "512"]
    with served(tmp_path, *argv) as lines:
        out = (tmp_path / "serve.out").read_text()
        row = re.search(r"^redis\s+(\d+)\s+127\.0\.0\.1:(\d+)", out, re.M)
        assert row is not None, out
        redis_pid, redis_port = int(row.group(1)), int(row.group(2))
        anonymous = redis.Redis(port=redis_port, retry=Retry(NoBackoff(), 0))
        with anonymous, pytest.raises(AuthenticationError):
            anonymous.dbsize()
        store = redis.Redis(port=redis_port, password=password)
        assert store.dbsize() > 0  # the cluster state the placer wrote
        client = openai.OpenAI(base_url=lines["openai"], api_key=lines["api key"], max_retries=0, timeout=60)
        os.kill(redis_pid, signal.SIGKILL)
        reply = client.completions.create(model="tiny", prompt="Hello there", max_tokens=3)
        assert reply.usage.completion_tokens >= 1  # served from the gateway's last snapshot
        deadline = time.monotonic() + 60
        while "redis is back" not in (tmp_path / "serve.out").read_text():
            assert time.monotonic() < deadline, (tmp_path / "serve.out").read_text()[-3000:]
            time.sleep(0.2)  # reading the CLI's output: it gives no other signal
        while store.dbsize() == 0:
            assert time.monotonic() < deadline, "nothing wrote the cluster state again"
            time.sleep(0.2)  # polling Redis for the state the services write on their own
        reply = client.completions.create(model="tiny", prompt="Hello again", max_tokens=3)
        assert reply.usage.completion_tokens >= 1


def test_serve_keeps_answering_through_a_placer_restart(
    tmp_path: Path, llama_gqa_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The placer SIGKILLed: the gateway picks from its own replica meanwhile; the placer comes back on
    its port and the worker's heartbeats reach it again (its node is in the placer's view)."""
    openai = pytest.importorskip("openai")
    token = "placer-restart-token"
    monkeypatch.setenv(INTERNAL_TOKEN_ENV, token)  # serve takes it instead of making one
    argv = [str(llama_gqa_dir), "--name", "tiny", "--port", "0", "--http-port", "0", "--max-model-len", "512"]
    with served(tmp_path, *argv) as lines:
        log = tmp_path / "serve.out"
        row = re.search(r"^placer\s+(\d+)\s+(127\.0\.0\.1:\d+)", log.read_text(), re.M)
        assert row is not None, log.read_text()
        client = openai.OpenAI(base_url=lines["openai"], api_key=lines["api key"], max_retries=0, timeout=60)
        os.kill(int(row.group(1)), signal.SIGKILL)
        reply = client.completions.create(model="tiny", prompt="While the placer is down", max_tokens=3)
        assert reply.usage.completion_tokens >= 1
        deadline = time.monotonic() + 60
        while "placer is back" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)  # reading the CLI's output: it gives no other signal
        worker_log = next((tmp_path / "runs").glob("*/worker-1.log"))
        while "placer reachable again" not in worker_log.read_text():
            assert time.monotonic() < deadline, "the worker's heartbeats never reached the new placer"
            time.sleep(0.2)  # the worker says so in its log once a heartbeat lands again
        assert _placer_lists_a_node(row.group(2), token)
        reply = client.completions.create(model="tiny", prompt="And after it", max_tokens=3)
        assert reply.usage.completion_tokens >= 1


def _placer_lists_a_node(address: str, token: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = placer_pb2_grpc.PlacerStub(channel).ListNodes(
            placer_pb2.ListNodesRequest(), metadata=((HEADER, token),), timeout=5
        )
    return len(reply.nodes) > 0
