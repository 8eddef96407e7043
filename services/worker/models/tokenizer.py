"""A checkpoint's tokenizer.json, and the per-request incremental detokenizer used while streaming."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers

from services.worker.models.chat_template import ChatTemplate, load_chat_template
from services.worker.models.errors import CheckpointError, NoChatTemplateError

# How many already-emitted tokens the incremental decoder re-decodes as context. Decoders such as
# SentencePiece's Metaspace drop a leading space at the start of a decode, so the window must start a
# few tokens before the new ones for their text to come out the same as in a full decode.
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class Tokenizer:
    """A Hugging Face fast tokenizer, and the checkpoint's chat template when it has one.

    Built from model_dir/tokenizer.json, or (from_object) from a tokenizer made elsewhere, e.g. from a
    GGUF file's metadata. chat_template: None when the checkpoint ships none (Chat is then refused);
    from a directory it is the one the directory ships (see chat_template.load_chat_template).
    """

    def __init__(self, model_dir: Path) -> None:
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(path, "file not found")
        try:
            tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception for malformed files
            raise CheckpointError(path, f"not a valid tokenizer.json ({err})") from err
        self._init(tok, path, load_chat_template(Path(model_dir)))

    @classmethod
    def from_object(
        cls, tok: tokenizers.Tokenizer, path: Path, chat_template: ChatTemplate | None = None
    ) -> Tokenizer:
        """Wrap an already built tokenizers.Tokenizer; path names where it came from (for errors)."""
        self = cls.__new__(cls)
        self._init(tok, Path(path), chat_template)
        return self

    def _init(self, tok: tokenizers.Tokenizer, path: Path, chat_template: ChatTemplate | None) -> None:
        # Some exported tokenizer.json files (MiniLM's among them) switch on fixed-length padding and
        # truncation; callers pad batches themselves and truncation is explicit (max_length) here.
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self.path = path
        self.chat_template = chat_template

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The tokenizers.Tokenizer itself, for libraries that take one (the grammar compiler)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce, added special tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True, max_length: int | None = None) -> list[int]:
        """Token ids of text, with the special tokens (BOS, [CLS]/[SEP]) its post-processor adds.
        max_length: None for no limit, else cut the text so the result, specials included, fits."""
        return self.encode_batch([text], add_special_tokens, max_length)[0]

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True, max_length: int | None = None
    ) -> list[list[int]]:
        """encode() for each text, unpadded, in parallel inside the tokenizers library."""
        if max_length is None:
            return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)]
        # Truncate the text's tokens, then add specials: keeps e.g. BERT's final [SEP], as HF does, without
        # enable_truncation(), which would mutate a tokenizer that other threads share.
        room = max_length - (self._tok.num_special_tokens_to_add(False) if add_special_tokens else 0)
        if room < 0:
            raise ValueError(f"max_length {max_length} leaves no room for the special tokens")
        out = []
        for enc in self._tok.encode_batch(list(texts), add_special_tokens=False):
            enc.truncate(room)
            out.append(self._tok.post_process(enc, add_special_tokens=add_special_tokens).ids)
        return out

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Token ids of messages rendered with the model's chat template (see ChatTemplate.render), as
        Hugging Face's apply_chat_template gives them: the template writes the special tokens itself, so
        none are added. NoChatTemplateError when the model has none; ChatTemplateError when it refuses."""
        if self.chat_template is None:
            raise NoChatTemplateError(f"{self.path.parent}: the model ships no chat template")
        text = self.chat_template.render(messages, tools, add_generation_prompt)
        return self.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ids; incomplete UTF-8 byte sequences come out as U+FFFD."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string (e.g. "</s>"), None if it is not in the vocabulary."""
        return self._tok.token_to_id(token)


class IncrementalDecoder:
    """Turns one request's generated ids into text deltas as they arrive.

    Each push decodes only a short window: ids[prefix:] against ids[prefix:read], where read is where
    the emitted text ends and prefix a few tokens before it. The difference is the new text. If it ends
    in U+FFFD, the last token ended inside a multi-byte character, so nothing is emitted and the window
    grows until the character completes. Concatenated deltas equal decode(generated ids).
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        # Only the last few prompt ids matter as context; keeping all would make the window O(prompt).
        self._ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)
        self._prefix_text = self._decode(self._prefix, self._read)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it completes ("" while a character is incomplete)."""
        self._ids.append(token_id)
        text = self._decode(self._prefix, len(self._ids))
        if len(text) <= len(self._prefix_text) or text.endswith(_REPLACEMENT):
            return ""
        delta = text[len(self._prefix_text) :]
        self._advance()
        return delta

    def flush(self) -> str:
        """Text still held back at the end of a request (an incomplete character comes out as U+FFFD)."""
        text = self._decode(self._prefix, len(self._ids))
        delta = text[len(self._prefix_text) :]
        self._advance()
        return delta

    def _advance(self) -> None:
        # Drop ids before the new context window so memory and decode cost stay constant per token.
        start = max(len(self._ids) - _CONTEXT_TOKENS, 0)
        self._ids = self._ids[start:]
        self._prefix = 0
        self._read = len(self._ids)
        self._prefix_text = self._decode(self._prefix, self._read)

    def _decode(self, start: int, end: int) -> str:
        return self._tok.decode(self._ids[start:end], skip_special_tokens=self._skip)
