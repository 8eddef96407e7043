"""Generated gRPC code matches protos/: regenerating changes nothing (the build made it, nobody edited it)."""

from __future__ import annotations

from pathlib import Path

from services.common.protogen import ROOT, generate


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    fresh = generate(tmp_path)
    assert fresh, "no .proto files found"
    for path in fresh:
        in_tree = ROOT / path.relative_to(tmp_path)
        assert in_tree.exists(), f"{in_tree} missing: run `make protos`"
        assert in_tree.read_bytes() == path.read_bytes(), f"{in_tree} is stale: run `make protos`"
