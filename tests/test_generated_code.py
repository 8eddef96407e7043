"""Generated gRPC code matches protos/: regenerating changes nothing (the build made it, nobody edited it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.common.protogen import ROOT, proto_files


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    # In a child process: protoc forks to run its plugins, and a fork() of this test process (torch,
    # threads, the in-process workers' arenas) can be refused under the kernel's heuristic overcommit,
    # which protoc answers with abort().
    subprocess.run(
        [sys.executable, "-m", "services.common.protogen", "--out", str(tmp_path)],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    fresh = sorted(tmp_path.rglob("*_pb2*.py*"))
    assert len(fresh) == 4 * len(proto_files()), "protoc wrote fewer files than there are protos"
    for path in fresh:
        in_tree = ROOT / path.relative_to(tmp_path)
        assert in_tree.exists(), f"{in_tree} missing: run `make protos`"
        assert in_tree.read_bytes() == path.read_bytes(), f"{in_tree} is stale: run `make protos`"
