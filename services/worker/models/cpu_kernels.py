"""The worker's own CPU kernels (csrc/), compiled for this machine by torch's cpp_extension and cached.

Built once per source, flags and CPU (the name carries a hash of them: -march=native code must never run
on another CPU that shares the cache directory), in torch's extension cache (TORCH_EXTENSIONS_DIR,
default ~/.cache/torch_extensions); `make setup` builds it, so a worker only loads it (under a second).
Where it cannot be built (no compiler, HANZO_CPU_KERNELS=0) the callers keep their PyTorch paths, and
the reason is logged once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

ENV_SWITCH = "HANZO_CPU_KERNELS"  # "0": never build or load them
_SOURCE = Path(__file__).with_name("csrc") / "paged_decode.cpp"
_CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # -fopenmp: at::parallel_for spreads over torch's threads

PagedDecode = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]


def paged_decode_kernel() -> PagedDecode | None:
    """paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale), or None where unavailable."""
    module = _module()
    return None if module is None else module.paged_decode


@functools.cache
def _module() -> object | None:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    try:
        import ninja  # cpp_extension runs `ninja`, which a virtualenv's bin may not have on PATH
        from torch.utils import cpp_extension

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        return cpp_extension.load(
            name=f"hanzo_cpu_kernels_{_build_key()}",
            sources=[str(_SOURCE)],
            extra_cflags=_CFLAGS,
            extra_ldflags=["-fopenmp"],
        )
    except Exception as err:  # no compiler, no headers, a build error: the PyTorch path still serves
        log.warning("CPU kernels unavailable, paged decode attention runs in PyTorch: %s", err)
        return None


def _build_key() -> str:
    """A hash of what the binary depends on beyond its source (cpp_extension hashes that itself)."""
    flags = ""
    with contextlib.suppress(OSError):  # no /proc: the machine's name alone
        flags = next(
            (line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), ""
        )
    text = "|".join([platform.machine(), flags, torch.__version__, " ".join(_CFLAGS)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build() -> None:
    """Compile (or find cached) now; `python -m services.worker.models.cpu_kernels` runs it for make."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    kernel = paged_decode_kernel()
    print("CPU kernels:", "ready" if kernel is not None else "unavailable (see the warning above)")


if __name__ == "__main__":
    build()
