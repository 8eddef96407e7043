"""Tokenizer round trips and the streaming IncrementalDecoder, on byte-level BPE and on WordPiece."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.worker.models.errors import CheckpointError
from services.worker.models.synthetic import BOS_ID, EOS_ID, write_tokenizer
from services.worker.models.tokenizer import IncrementalDecoder, Tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "héllo wörld 日本語 🙂",
    "🙂🙂 emoji pairs 👩‍💻 and a flag 🇫🇷",
    "  leading spaces, tabs\tand\nnewlines  ",
    "Ünïcödé mixed with ASCII: naïve café, Zürich, Øresund, Ελληνικά, русский, عربى",
    "",
]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer(write_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=512).parent)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(bpe: Tokenizer, text: str) -> None:
    ids = bpe.encode(text)
    assert ids[0] == BOS_ID  # the post-processor adds <s>, like Llama's tokenizer
    assert bpe.decode(ids) == text
    assert bpe.encode(text, add_special_tokens=False) == ids[1:]
    assert max(ids) < bpe.vocab_size == 512


def test_batch_and_max_length(bpe: Tokenizer) -> None:
    assert bpe.encode_batch(TEXTS) == [bpe.encode(t) for t in TEXTS]
    cut = bpe.encode(TEXTS[0], max_length=4)
    assert len(cut) == 4 and cut == bpe.encode(TEXTS[0])[:4]
    assert bpe.decode([BOS_ID, *bpe.encode("hi", add_special_tokens=False), EOS_ID]) == "hi"
    assert bpe.token_to_id("</s>") == EOS_ID


def stream(tokenizer: Tokenizer, prompt: list[int], generated: list[int]) -> list[str]:
    decoder = IncrementalDecoder(tokenizer, prompt)
    deltas = [decoder.push(token) for token in generated]
    deltas.append(decoder.flush())
    return deltas


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("prompt_text", ["", "A prompt before the output: "])
def test_incremental_matches_full_decode(bpe: Tokenizer, text: str, prompt_text: str) -> None:
    prompt = bpe.encode(prompt_text)
    generated = bpe.encode(text, add_special_tokens=False)
    deltas = stream(bpe, prompt, generated)
    assert "".join(deltas) == bpe.decode(generated)
    assert not any("\ufffd" in d for d in deltas)  # never a half character
    assert deltas[-1] == ""  # everything complete was already emitted


def test_incremental_holds_back_partial_characters(bpe: Tokenizer) -> None:
    generated = bpe.encode("🙂", add_special_tokens=False)
    assert len(generated) > 1  # the emoji's 4 bytes are split over several byte-level tokens
    deltas = stream(bpe, [BOS_ID], generated)
    assert deltas[:-1] == [""] * (len(generated) - 1) + ["🙂"]


def test_incremental_skips_special_tokens_and_flushes_incomplete(bpe: Tokenizer) -> None:
    hi = bpe.encode("hi", add_special_tokens=False)
    partial = bpe.encode("🙂", add_special_tokens=False)[:1]
    assert "".join(stream(bpe, [], [*hi, EOS_ID, *hi])) == "hihi"
    deltas = stream(bpe, [], [*hi, *partial])
    assert "".join(deltas[:-1]) == "hi" and deltas[-1] == "\ufffd"


def test_incremental_on_wordpiece(minilm_dir: Path) -> None:
    # WordPiece decoding joins "##" pieces and puts spaces between words, so after a prompt the first
    # delta starts with a space: deltas continue the prompt's text exactly as a full decode would.
    tokenizer = Tokenizer(minilm_dir)
    prompt = tokenizer.encode("query:", add_special_tokens=False)
    for text in ("embeddings are unbelievably useful, aren't they?", "naïve café"):
        generated = tokenizer.encode(text, add_special_tokens=False)
        full = tokenizer.decode(prompt + generated)
        assert "".join(stream(tokenizer, prompt, generated)) == full[len(tokenizer.decode(prompt)) :]
        assert "".join(stream(tokenizer, [], generated)) == tokenizer.decode(generated)


def test_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as info:
        Tokenizer(tmp_path)
    assert info.value.path.name == "tokenizer.json" and "not found" in str(info.value)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(CheckpointError, match=r"not a valid tokenizer\.json"):
        Tokenizer(tmp_path)
