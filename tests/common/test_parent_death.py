"""A service started by a launcher dies with it, even when the launcher is SIGKILLed (no stop in order)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from services.common.parent_death import PARENT_ENV

ROOT = Path(__file__).resolve().parents[2]

# The grandchild holds the pipe's write end: the test reads EOF exactly when it has exited.
_SERVICE = textwrap.dedent("""
    import sys, time
    from services.common.parent_death import die_with_launcher
    die_with_launcher()
    print("up", flush=True)
    time.sleep(120)
""")
_LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys
    from services.common.parent_death import launcher_env
    fd = int(sys.argv[1])
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], pass_fds=(fd,), stdout=fd,
                             env={**os.environ, **launcher_env()}, start_new_session=True)
    os.close(fd)
    child.wait()
""")


def _run(code: str, *args: str, **kwargs: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def test_service_dies_when_its_launcher_is_killed() -> None:
    read_end, write_end = os.pipe()
    launcher = _run(_LAUNCHER, str(write_end), _SERVICE, pass_fds=(write_end,))
    os.close(write_end)
    with os.fdopen(read_end, "rb") as service_out:
        assert select.select([service_out], [], [], 60)[0], "the service never started"
        assert service_out.readline() == b"up\n"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert select.select([service_out], [], [], 30)[0], "the service outlived its launcher"
        assert service_out.read() == b""


def test_service_whose_launcher_is_already_gone_exits() -> None:
    # Named launcher is not our parent: it died before the service could ask for PDEATHSIG.
    service = _run(_SERVICE, env={**os.environ, PARENT_ENV: "1"}, stdout=subprocess.PIPE)
    out, _ = service.communicate(timeout=60)
    assert service.returncode == -signal.SIGTERM
    assert out == b""


def test_service_started_by_hand_ignores_the_watch() -> None:
    env = {k: v for k, v in os.environ.items() if k != PARENT_ENV}
    service = _run(_SERVICE.replace("time.sleep(120)", ""), env=env, stdout=subprocess.PIPE)
    out, _ = service.communicate(timeout=60)
    assert (service.returncode, out) == (0, b"up\n")


def test_a_malformed_launcher_id_stops_the_service_saying_why() -> None:
    service = _run(_SERVICE, env={**os.environ, PARENT_ENV: "gateway"}, stderr=subprocess.PIPE)
    _, err = service.communicate(timeout=60)
    assert service.returncode == 1
    assert b"HANZO_DIE_WITH_PARENT must be the launcher's process id, got 'gateway'" in err
