"""Generate the Python code (messages, typed stubs, gRPC services) for protos/ into the repo root.

Run by the build (`make protos`, part of every make target); the output package `hanzo/` is never
edited by hand and not committed. `python -m services.common.protogen [--out DIR]`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "protos"


def proto_files() -> list[Path]:
    """Every .proto under protos/, sorted."""
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(out_dir: Path = ROOT) -> list[Path]:
    """Run protoc into out_dir; returns the files written. Raises RuntimeError if protoc fails."""
    from grpc_tools import protoc  # build-time dependency (grpcio-tools)

    files = proto_files()
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf well-known types
    # mypy-protobuf's plugin types the gRPC stubs and servicers (protoc's --pyi_out covers messages only).
    grpc_stubs_plugin = Path(sys.executable).parent / "protoc-gen-mypy_grpc"
    if not grpc_stubs_plugin.exists():
        raise RuntimeError(f"{grpc_stubs_plugin} missing: install the build extra (pip install '.[build]')")
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--plugin=protoc-gen-mypy_grpc={grpc_stubs_plugin}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_grpc_out=quiet:{out_dir}",
        *(str(f.relative_to(PROTO_ROOT)) for f in files),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(map(str, files))}")
    written = []
    for f in files:
        package = f.parent.relative_to(PROTO_ROOT)
        # Regular packages (an __init__.py at each level) so setuptools and type checkers find them.
        for depth in range(1, len(package.parts) + 1):
            (out_dir.joinpath(*package.parts[:depth]) / "__init__.py").touch()
        suffixes = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
        written += [out_dir / package / f"{f.stem}{suffix}" for suffix in suffixes]
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT)
    args = parser.parse_args()
    written = generate(args.out)
    print(f"generated {len(written)} files under {args.out / 'hanzo'}", file=sys.stderr)


if __name__ == "__main__":
    main()
