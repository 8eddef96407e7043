"""The embedding engine on the real MiniLM: equal to sentence-transformers, concurrent calls batched."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from services.worker.engine import InvalidRequestError
from services.worker.engine.embedding import EmbeddingEngine

TEXTS = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Paged attention keeps the KV cache in fixed-size blocks so that memory is not fragmented. " * 6,
    "héllo wörld 日本語 🙂",
    "Embeddings",
]


@pytest.fixture(scope="module")
def embedder(minilm_dir: Path) -> Iterator[EmbeddingEngine]:
    engine = EmbeddingEngine(minilm_dir)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(minilm_dir: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, convert_to_numpy=True)


def test_matches_sentence_transformers(embedder: EmbeddingEngine, reference: np.ndarray) -> None:
    ours = embedder.encode(TEXTS)
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 384)
    cosine = (ours * reference).sum(axis=1) / (
        np.linalg.norm(ours, axis=1) * np.linalg.norm(reference, axis=1)
    )
    assert cosine.min() >= 0.9999


def test_long_input_is_truncated_like_the_reference(embedder: EmbeddingEngine, minilm_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    long_text = "tokens " * 600  # past MiniLM's 256-token limit
    ref = SentenceTransformer(str(minilm_dir), device="cpu").encode([long_text])[0]
    ours = embedder.encode([long_text])[0]
    assert float(ours @ ref) / float(np.linalg.norm(ref)) >= 0.9999


def test_concurrent_callers_share_batches(embedder: EmbeddingEngine, reference: np.ndarray) -> None:
    before = embedder.num_batches
    start = threading.Barrier(8)
    results: dict[int, np.ndarray] = {}

    def call(i: int) -> None:
        start.wait()
        results[i] = embedder.encode([TEXTS[i % len(TEXTS)]])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert embedder.num_batches - before < 8  # some calls rode in the same forward
    for i, vectors in results.items():
        np.testing.assert_allclose(vectors[0], reference[i % len(TEXTS)], atol=2e-4)


async def test_async_encode(embedder: EmbeddingEngine, reference: np.ndarray) -> None:
    outs = await asyncio.gather(*(embedder.encode_async([t]) for t in TEXTS))
    np.testing.assert_allclose(np.concatenate(outs), reference, atol=2e-4)


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        ([], "inputs"),
        ("just a string", "inputs"),
        (["ok", ""], "inputs[1]"),
        (["   "], "inputs[0]"),
        ([3], "inputs[0]"),
    ],
)
def test_bad_inputs(embedder: EmbeddingEngine, inputs: object, field: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        embedder.encode(inputs)  # type: ignore[arg-type]
    assert err.value.field == field
