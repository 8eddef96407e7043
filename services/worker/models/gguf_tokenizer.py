"""The tokenizer (and chat template) a GGUF file's metadata describes, as a tokenizers.Tokenizer.

Only byte-level BPE vocabularies (tokenizer.ggml.model 'gpt2': GPT-2, SmolLM, Llama 3, Qwen2 and most
recent models) are built; SentencePiece ('llama') and the others raise CheckpointError.
"""

from __future__ import annotations

from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from services.worker.models.chat_template import ChatTemplate
from services.worker.models.errors import CheckpointError
from services.worker.models.gguf_file import GGUFFile
from services.worker.models.tokenizer import Tokenizer

# llama.cpp's token types (llama_token_type): these are matched whole in text, never split by BPE.
_CONTROL, _USER_DEFINED = 3, 4
# tokenizer.ggml.pre values whose llama.cpp split is the GPT-2 regex after isolating every digit.
_DIGITS_THEN_GPT2 = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
)
# Pre-tokenizers llama.cpp splits with a regex of their own (copied from llama-vocab.cpp).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_REGEX_SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}


def gguf_tokenizer(gguf: GGUFFile) -> Tokenizer | None:
    """gguf's tokenizer with its chat template (tokenizer.chat_template; None if absent), or None when
    the file has no tokenizer metadata. CheckpointError naming the file for a tokenizer model we do not
    build (e.g. 'llama', SentencePiece) or malformed token lists."""
    meta = gguf.metadata
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        return None
    if kind != "gpt2":
        problem = f"tokenizer.ggml.model {kind!r} is not supported (only 'gpt2', byte-level BPE)"
        raise CheckpointError(gguf.path, problem)
    tokens = _string_list(gguf, "tokenizer.ggml.tokens")
    merges = _string_list(gguf, "tokenizer.ggml.merges")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        problem = f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens"
        raise CheckpointError(gguf.path, problem)
    tok = _byte_level_bpe(gguf, tokens, merges)
    # Control tokens (<|im_start|>) are special: skipped when decoding with skip_special_tokens.
    # User-defined ones (<think>) are matched whole but decoded like text, as llama.cpp renders them.
    kinds = list(zip(tokens, types, strict=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in kinds if k == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in kinds if k == _USER_DEFINED])
    bos, eos = _token(gguf, tokens, "bos_token_id"), _token(gguf, tokens, "eos_token_id")
    post = _post_processor(gguf, tokens, bos, eos)
    if post is not None:
        tok.post_processor = post
    source = meta.get("tokenizer.chat_template")
    template = ChatTemplate(source=source, bos_token=bos, eos_token=eos) if isinstance(source, str) else None
    return Tokenizer.from_object(tok, gguf.path, template)


def pre_tokenizer_for(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer matching llama.cpp's split for tokenizer.ggml.pre: digits one by one then GPT-2's
    regex for SmolLM / StarCoder-like vocabularies, Llama 3's and Qwen2's own regexes, GPT-2's regex
    (ByteLevel's own) for 'gpt2', 'default', and any value we do not know."""
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _REGEX_SPLITS:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_REGEX_SPLITS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _byte_level_bpe(gguf: GGUFFile, tokens: list[str], merges: list[str]) -> tokenizers.Tokenizer:
    # Byte-level vocabularies spell every byte as a printable character (space is 'Ġ'), so a merge is
    # exactly two such spellings separated by the one real space.
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise CheckpointError(gguf.path, f"tokenizer.ggml.merges entry {merge!r} is not 'left right'")
        pairs.append((left, right))
    vocab = {token: index for index, token in enumerate(tokens)}
    unk = _token(gguf, tokens, "unknown_token_id")
    try:
        bpe = models.BPE(vocab=vocab, merges=pairs, unk_token=unk, fuse_unk=False, byte_fallback=False)
    except Exception as err:  # tokenizers raises a bare Exception for a merge of unknown tokens
        raise CheckpointError(gguf.path, f"tokenizer.ggml.merges do not fit the vocabulary ({err})") from err
    tok = tokenizers.Tokenizer(bpe)
    pre = gguf.metadata.get("tokenizer.ggml.pre")
    tok.pre_tokenizer = pre_tokenizer_for(pre if isinstance(pre, str) else None)
    tok.decoder = decoders.ByteLevel()
    return tok


def _post_processor(
    gguf: GGUFFile, tokens: list[str], bos: str | None, eos: str | None
) -> processors.PostProcessor | None:
    """BOS / EOS around every encoded text as tokenizer.ggml.add_bos_token / add_eos_token ask (absent:
    neither, as for llama.cpp's byte-level vocabularies); None when neither is added."""
    meta = gguf.metadata
    added = {}
    if meta.get("tokenizer.ggml.add_bos_token") is True and bos is not None:
        added["bos"] = (bos, meta["tokenizer.ggml.bos_token_id"])
    if meta.get("tokenizer.ggml.add_eos_token") is True and eos is not None:
        added["eos"] = (eos, meta["tokenizer.ggml.eos_token_id"])
    if not added:
        return None
    prefix = [added["bos"][0]] if "bos" in added else []
    suffix = [added["eos"][0]] if "eos" in added else []
    single = " ".join([*prefix, "$A", *suffix])
    pair = " ".join([*prefix, "$A", *suffix, *prefix, "$B:1", *suffix])
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(set(added.values())))


def _token(gguf: GGUFFile, tokens: list[str], key: str) -> str | None:
    """The token string of tokenizer.ggml.<key> (an id), None when the key is absent."""
    index = gguf.metadata.get(f"tokenizer.ggml.{key}")
    if index is None:
        return None
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tokens):
        raise CheckpointError(gguf.path, f"tokenizer.ggml.{key} {index!r} is not a token id")
    return tokens[index]


def _string_list(gguf: GGUFFile, key: str) -> list[str]:
    value: Any = gguf.metadata.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(gguf.path, f"missing or invalid metadata {key!r} (a list of strings)")
    return value
