"""A private redis-server on a free loopback port (tests, benchmarks and the local stack start their own).

It requires a password (`--requirepass`): loopback is shared by every local user and process, and the
cluster state in it decides where requests go. The password is carried in `url`
(`redis://:PASSWORD@127.0.0.1:PORT/0`, read by redis-py's from_url), so whoever gets the url is let in
and nobody else; show it with services/common/redact.py's redact_url."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

# The password a caller may choose for the private Redis (`hanzo-mesh up/serve`), so that it can reach
# the cluster state itself; the same name the compose file requires for its Redis.
PASSWORD_ENV = "HANZO_REDIS_PASSWORD"


def password_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """HANZO_REDIS_PASSWORD, or None where it is unset or blank (then RedisServer makes one)."""
    return environ.get(PASSWORD_ENV, "").strip() or None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisNotInstalledError(RuntimeError):
    """No redis-server binary on PATH."""


def resp_command(*words: str) -> bytes:
    """One command in RESP (Redis's protocol) as an array of bulk strings: a password with spaces or
    CR/LF in it stays one argument, as it would not in the inline form."""
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class RedisServer:
    """`start()` / `stop()` may be called repeatedly; the port and the password stay the same, so clients
    holding `url` reconnect. password: None generates one for this server."""

    def __init__(self, workdir: Path, port: int | None = None, password: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisNotInstalledError(
                "redis-server is not installed: run `sudo apt-get install -y redis-server` "
                "(`make setup` does it when run as root), or pass --redis-url to use a running Redis"
            )
        if password is not None and not password:
            raise ValueError("an empty Redis password would leave the server open: pass None to generate one")
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_port()
        self.password = password if password is not None else secrets.token_urlsafe(24)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The authenticated URL, `redis://:PASSWORD@127.0.0.1:PORT/0`: a secret, never print it as is."""
        return f"redis://:{quote(self.password, safe='')}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it and return once it answers an authenticated PING (RuntimeError after 10 s)."""
        # redis-server replaces its process title at start (`redis-server 127.0.0.1:PORT`), so the
        # password does not stay in `ps` output.
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--requirepass",
                self.password,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break  # it exited (the port taken, say): waiting longer cannot help
            try:
                if self._answers_ping():
                    return
            except OSError:
                pass
            time.sleep(0.02)  # the server is still binding: poll its port, bounded by the deadline
        raise RuntimeError(f"redis-server did not answer an authenticated PING on port {self.port}")

    def _answers_ping(self) -> bool:
        """True once AUTH is accepted and PING answered; OSError while nothing listens yet."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
            conn.sendall(resp_command("AUTH", self.password) + resp_command("PING"))
            reply = b""
            while b"\r\n" not in reply.partition(b"\r\n")[2]:  # two replies: +OK and +PONG
                chunk = conn.recv(64)
                if not chunk:
                    return False
                reply += chunk
            return reply.startswith(b"+OK\r\n+PONG\r\n")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None
