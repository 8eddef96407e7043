"""The tokenizer built from the real SmolLM2 GGUF's metadata against transformers' GGUF tokenizer: the
same ids on every text, special tokens whole, decode round-trips; and the pre-tokenizer per
tokenizer.ggml.pre."""

from __future__ import annotations

import time
from typing import Any

import pytest

from services.worker.models.catalog import resolve_model_source
from services.worker.models.gguf_file import read_gguf
from services.worker.models.gguf_tokenizer import gguf_tokenizer, pre_tokenizer_for
from services.worker.models.tokenizer import Tokenizer

GGUF = resolve_model_source("smollm2")
TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog.",
    "digits": "12345",
    "digits_after_space": "pay 12345 or 6.78 now",
    "code": "def f(x):\n    return x ** 2  # square\n\tif x != 0: print(f'{x}')",
    "unicode": "héllo wörld, 日本語, Привет",
    "emoji": "I love 🐍 and 👩‍💻!",
    "leading_spaces": "   three spaces",
    "newlines": "a\n\nb\r\n c",
    "contractions": "it's they're we'll I'd",
    "chatml": "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "specials_adjacent": "<|im_start|><|im_end|>x<|endoftext|>",
    "empty": "",
}
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    tokenizer = gguf_tokenizer(read_gguf(GGUF))
    assert tokenizer is not None
    return tokenizer


@pytest.fixture(scope="module")
def reference() -> Any:
    """transformers' tokenizer of the same file; ~10 s on 2 cores (it parses the whole file)."""
    from transformers import AutoTokenizer

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    print(f"\nreference GGUF tokenizer load: {time.perf_counter() - start:.1f} s")
    return tokenizer


@pytest.mark.parametrize("name", TEXTS)
def test_ids_equal_transformers(name: str, ours: Tokenizer, reference: Any) -> None:
    text = TEXTS[name]
    ids = ours.encode(text)
    assert ids == reference(text)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


def test_special_tokens_are_single_ids_and_no_bos_is_added(ours: Tokenizer) -> None:
    assert ours.encode("<|im_start|>") == [1]  # tokenizer.ggml.add_bos_token is false
    assert ours.encode("<|im_end|>") == [2]
    assert ours.decode([1, 4093, 2]) == "user"  # control tokens are skipped with skip_special_tokens
    assert ours.vocab_size == 49152


def test_chat_template_renders_as_transformers(ours: Tokenizer, reference: Any) -> None:
    assert ours.chat_template is not None
    assert ours.chat_template.eos_token == "<|im_end|>" and ours.chat_template.bos_token == "<|im_start|>"
    for messages in (MESSAGES, MESSAGES[1:]):
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.chat_template.render(messages) == expected


PRE_TOKENIZER_CASES = [
    # (tokenizer.ggml.pre, text, pieces): digits one by one for SmolLM/StarCoder, groups of up to three
    # for Llama 3, one by one for Qwen2 (which also splits words off punctuation its own way).
    ("smollm", "ab 1234", ["ab", "Ġ", "1", "2", "3", "4"]),
    ("starcoder", "x=42", ["x", "=", "4", "2"]),
    ("gpt2", "ab 1234", ["ab", "Ġ1234"]),
    ("default", "ab 1234", ["ab", "Ġ1234"]),
    ("some-new-model", "ab 1234", ["ab", "Ġ1234"]),
    (None, "ab 1234", ["ab", "Ġ1234"]),
    ("llama-bpe", "ab 1234567", ["ab", "Ġ", "123", "456", "7"]),
    ("qwen2", "ab 123", ["ab", "Ġ", "1", "2", "3"]),
]


@pytest.mark.parametrize(("pre", "text", "pieces"), PRE_TOKENIZER_CASES)
def test_pre_tokenizer_per_ggml_pre(pre: str | None, text: str, pieces: list[str]) -> None:
    assert [piece for piece, _ in pre_tokenizer_for(pre).pre_tokenize_str(text)] == pieces
