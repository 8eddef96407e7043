"""RedisServer on a real redis-server: it requires its password, which only its url carries; the password
outlives a stop/start on the same port; a chosen one (any characters) is used as given."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError
from redis.retry import Retry

from services.common.redact import redact_url
from services.common.redis_server import PASSWORD_ENV, RedisServer, password_from_env

Client = Callable[[RedisServer], redis.Redis]

# redis-py retries a refused connection with backoff (seconds); the refusal is the same each time.
ONCE = {"retry": Retry(NoBackoff(), 0)}
REFUSED: list[tuple[str, Client]] = [
    ("no password", lambda s: redis.Redis(host="127.0.0.1", port=s.port, **ONCE)),
    ("its address alone", lambda s: redis.Redis.from_url(f"redis://127.0.0.1:{s.port}/0", **ONCE)),
    ("a wrong password", lambda s: redis.Redis(port=s.port, password=s.password + "x", **ONCE)),
]


@pytest.mark.parametrize(("who", "client"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_client_without_the_password_is_refused(
    redis_server: RedisServer, who: str, client: Client
) -> None:
    # NOAUTH, WRONGPASS, or (redis-py 8 says HELLO first) HELLO's own refusal: AuthenticationError each.
    with client(redis_server) as conn, pytest.raises(AuthenticationError):
        conn.set("k", "v")
    with redis.Redis.from_url(redis_server.url) as conn:
        assert conn.exists("k") == 0  # nothing was written


def test_a_client_with_the_url_is_served(redis_server: RedisServer) -> None:
    assert redis_server.url == f"redis://:{redis_server.password}@127.0.0.1:{redis_server.port}/0"
    with redis.Redis.from_url(redis_server.url) as conn:
        assert conn.ping() is True
        conn.set("k", "v")
        assert conn.get("k") == b"v"


def test_the_password_survives_a_restart_on_the_same_port(redis_server: RedisServer) -> None:
    url, port = redis_server.url, redis_server.port
    redis_server.stop()
    redis_server.start()
    assert (redis_server.url, redis_server.port) == (url, port)
    with redis.Redis.from_url(url) as conn:
        assert conn.ping() is True
    with redis.Redis(port=port, **ONCE) as anonymous, pytest.raises(AuthenticationError):
        anonymous.ping()


@pytest.mark.parametrize(
    "password",
    [
        "p@ss:w/rd with %20 spaces?#",  # characters that mean something in a URL
        "--save",  # what redis-server's command line would read as an option
        "quotes \" ' and a\ttab",  # what its config parser unquotes
    ],
)
def test_a_chosen_password_is_used_and_quoted_in_the_url(tmp_path: Path, password: str) -> None:
    server = RedisServer(tmp_path, password=password)
    server.start()
    try:
        assert server.password == password
        assert unquote(urlsplit(server.url).password or "") == password  # percent-encoded where it must be
        assert redact_url(server.url) == f"redis://:***@127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(server.url) as conn:
            assert conn.ping() is True
        with redis.Redis(port=server.port, password=password) as conn:
            assert conn.ping() is True
    finally:
        server.stop()


def test_each_server_makes_its_own_password(tmp_path: Path) -> None:
    first, second = RedisServer(tmp_path), RedisServer(tmp_path)
    assert len(first.password) >= 32 and first.password != second.password


def test_an_empty_password_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="open"):
        RedisServer(tmp_path, password="")


@pytest.mark.parametrize(
    ("environ", "password"),
    [
        ({PASSWORD_ENV: "chosen"}, "chosen"),
        ({PASSWORD_ENV: "  chosen \n"}, "chosen"),
        ({PASSWORD_ENV: " "}, None),
        ({}, None),
    ],
)
def test_password_from_env(environ: dict[str, str], password: str | None) -> None:
    assert password_from_env(environ) == password


def test_the_password_is_not_left_on_the_process_command_line(redis_server: RedisServer) -> None:
    cmdline = Path(f"/proc/{redis_server.process.pid}/cmdline")  # type: ignore[union-attr]
    if not cmdline.exists():
        pytest.skip("no /proc: cannot read another process's command line here")
    # redis-server replaces its process title once started: `ps` shows no --requirepass argument.
    assert redis_server.password not in cmdline.read_text(errors="replace")
