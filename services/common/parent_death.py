"""A launched service dies with its launcher: the child asks the kernel for SIGTERM when its parent goes.

The launcher names itself in `HANZO_DIE_WITH_PARENT`; the child sets PDEATHSIG on itself at start-up. This
is done child-side rather than in a `preexec_fn` because a preexec_fn forces a full fork() of the launcher
(a test run or CLI holding models: gigabytes), which fails with ENOMEM on machines that do not overcommit;
without one, subprocess uses vfork."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "HANZO_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def launcher_env() -> dict[str, str]:
    """The variable a launcher adds to a child's environment."""
    return {PARENT_ENV: str(os.getpid())}


def die_with_launcher() -> None:
    """Called first thing by a service: SIGTERM to ourselves once the launcher exits (Linux only)."""
    expected = os.environ.pop(PARENT_ENV, "")  # not inherited by whatever this service starts
    if not expected or sys.platform != "linux":
        return
    if not expected.isdigit():
        raise SystemExit(
            f"{PARENT_ENV} must be the launcher's process id, got {expected!r}; unset it to run alone"
        )
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    # The launcher may have died before the prctl above: then we were already reparented.
    if os.getppid() != int(expected):
        os.kill(os.getpid(), signal.SIGTERM)


def _exec_dying_with_launcher(argv: list[str]) -> None:
    """`python -m services.common.parent_death BINARY ARGS...`: a non-Python program (Prometheus) dies
    with its launcher too: PDEATHSIG is set here and survives the exec."""
    die_with_launcher()
    os.execv(argv[0], argv)


if __name__ == "__main__":
    _exec_dying_with_launcher(sys.argv[1:])
