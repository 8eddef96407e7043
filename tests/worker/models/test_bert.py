"""BertEncoder on the real all-MiniLM-L6-v2 against sentence-transformers as the reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.worker.models.bert import BertEncoder
from services.worker.models.loader import LoadedModel, load_model

TEXTS = [
    "Hello world.",
    "A",
    "The quick brown fox jumps over the lazy dog.",
    "Continuous batching keeps the GPU busy by scheduling at the granularity of single iterations.",
    "¿Dónde está la biblioteca? Está cerca del río.",
    "日本語のテキストも埋め込みできます。",
    "emoji 🙂 and symbols: <tag> {json: 1} [x] 3.14159",
    " ".join(["long input"] * 60),
    "   leading and trailing spaces   ",
    "Paris is the capital of France, and Berlin is the capital of Germany; both are large cities.",
]


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> LoadedModel:
    return load_model(minilm_dir)


def embed(loaded: LoadedModel, texts: list[str]) -> torch.Tensor:
    """Our embeddings for texts, run as one right-padded batch."""
    assert loaded.tokenizer is not None
    ids = loaded.tokenizer.encode_batch(texts, max_length=loaded.config.max_seq_length)
    width = max(map(len, ids))
    input_ids = torch.tensor([row + [0] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    with torch.inference_mode():
        return loaded.model(input_ids, mask)


def test_loads_as_encoder(minilm: LoadedModel) -> None:
    assert isinstance(minilm.model, BertEncoder)
    assert not minilm.model.training
    assert all(p.device.type == "cpu" for p in minilm.model.parameters())


def test_matches_sentence_transformers(minilm: LoadedModel, minilm_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_dir), device="cpu")
    # The checkpoint's modules.json ends in a Normalize module, so the reference output is unit length.
    expected = torch.from_numpy(reference.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True))
    ours = embed(minilm, TEXTS)
    assert ours.dtype == torch.float32
    assert ours.shape == (len(TEXTS), 384)
    cosine = torch.nn.functional.cosine_similarity(ours, expected, dim=-1)
    assert cosine.min().item() >= 0.9999, cosine.tolist()
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(TEXTS)))


def test_padding_does_not_change_embeddings(minilm: LoadedModel) -> None:
    alone = torch.cat([embed(minilm, [text]) for text in TEXTS[:4]])
    batched = embed(minilm, TEXTS[:4])  # padded to the longest of the four
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


def test_bfloat16_close_to_float32(minilm: LoadedModel, minilm_dir: Path) -> None:
    low = load_model(minilm_dir, dtype="bfloat16")
    ours, reference = embed(low, TEXTS), embed(minilm, TEXTS)
    assert ours.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(ours, reference, dim=-1).min().item() >= 0.99
