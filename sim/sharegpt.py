"""Turn lengths of real multi-turn conversations: ShareGPT V3 (the file vLLM's serving benchmark
samples), tokenized with SmolLM2's tokenizer, as [(user tokens, reply tokens), ...] per conversation.

Tokenizing is the slow part (seconds), and its result depends only on the file and the count, so it is
cached under .cache/sim/ next to the repository's other generated data.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.serving_data import dataset_path, iter_conversations
from services.worker.models.catalog import resolve_model_source
from services.worker.models.gguf_file import read_gguf
from services.worker.models.gguf_tokenizer import gguf_tokenizer
from services.worker.models.tokenizer import Tokenizer

CACHE_DIR = Path(__file__).resolve().parents[1] / ".cache" / "sim"
MAX_TURN_TOKENS = 4096  # a pasted document longer than this is cut, as a serving front would
MIN_TOKENS = 4  # as vLLM's sampler: shorter turns are mostly broken exchanges

Conversation = list[tuple[int, int]]


def conversations(count: int) -> list[Conversation]:
    """The first `count` usable conversations of the file, in file order (callers shuffle with their
    own seed)."""
    cache = CACHE_DIR / f"sharegpt_turns_{count}.json"
    if cache.exists():
        return [[(u, r) for u, r in conv] for conv in json.loads(cache.read_text())]
    found = _tokenized(count)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(found))
    return found


def _tokenized(count: int) -> list[Conversation]:
    tokenizer = _smollm2_tokenizer()
    text = dataset_path().read_text(encoding="utf-8")
    found: list[Conversation] = []
    for item in iter_conversations(text):
        exchanges = _exchanges(item)
        if not exchanges:
            continue
        flat = [t for pair in exchanges for t in pair]
        lengths = [min(len(ids), MAX_TURN_TOKENS) for ids in tokenizer.encode_batch(flat, False)]
        turns = [
            (u, r)
            for u, r in zip(lengths[::2], lengths[1::2], strict=True)
            if u >= MIN_TOKENS and r >= MIN_TOKENS
        ]
        if turns:
            found.append(turns)
        if len(found) == count:
            break
    return found


def _exchanges(conversation: dict[str, object]) -> list[tuple[str, str]]:
    """Consecutive (human, gpt) pairs from the start, stopping at the first turn out of order."""
    turns = conversation.get("conversations")
    if not isinstance(turns, list):
        return []
    pairs = []
    for human, reply in zip(turns[::2], turns[1::2], strict=False):
        if not (isinstance(human, dict) and isinstance(reply, dict)):
            break
        if human.get("from") != "human" or reply.get("from") != "gpt":
            break
        h, r = human.get("value"), reply.get("value")
        if not (isinstance(h, str) and isinstance(r, str) and h.strip() and r.strip()):
            break
        pairs.append((h, r))
    return pairs


def _smollm2_tokenizer() -> Tokenizer:

    loaded = gguf_tokenizer(read_gguf(resolve_model_source("smollm2")))
    if loaded is None:
        raise RuntimeError("SmolLM2's GGUF file carries no tokenizer")
    return loaded
