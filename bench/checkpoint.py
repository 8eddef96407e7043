"""The benchmark's generated Llama checkpoint (~19M parameters), built once into a cache folder."""

from __future__ import annotations

import shutil
from pathlib import Path

DEFAULT_MODEL_DIR = Path(".cache/bench/llama-19m")

# 2 x 32000 x 256 embedding/LM-head params + 4 layers of attention and MLP: ~19.3M parameters in total.
LLAMA_19M = {
    "arch": "llama",
    "vocab_size": 32000,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 2,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
    "seed": 0,
    "dtype": "float32",
}


def ensure_checkpoint(model_dir: Path, spec: dict[str, object] | None = None) -> Path:
    """Returns `model_dir`, generating the checkpoint there first (spec: make_decoder_checkpoint's
    arguments, None for LLAMA_19M) if it holds no config.json."""
    if (model_dir / "config.json").exists():
        return model_dir
    from services.worker.models.synthetic import make_decoder_checkpoint

    # Build beside the target and rename, so an interrupted build never leaves a half-written cache behind.
    partial = model_dir.with_name(model_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    make_decoder_checkpoint(partial, **(spec or LLAMA_19M))  # type: ignore[arg-type]
    partial.rename(model_dir)
    return model_dir
