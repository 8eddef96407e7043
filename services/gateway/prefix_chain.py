"""A prompt's prefix chain: what the placer's prefix memo (services/placer/pick/memo.py) is keyed by.

Element i is a stable hash of the prompt up to the end of its block i, so it names that whole prefix:
two prompts share element i exactly when they agree up to there. The placer remembers every element of
a prompt against the node it chose and routes a later prompt to the node that served its longest
remembered prefix, which is where that prefix's KV blocks most likely still are (llm-d's precise
prefix-cache routing keys its index by chained block hashes the same way). A prefix of the first block
alone is not enough: an agent tenant's sessions all open with the same tool prompt, so a key over the
opening sends every turn of every session to wherever the tenant's last request went, away from the
history its own turn could reuse.

The hashes are blake2b, not Python's hash(), which is salted per process: every gateway replica must
compute the same chain."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from hanzo.inference.v1 import inference_pb2
from services.placer.pick.query import MAX_PREFIX_CHAIN, TOKENS_PER_ELEMENT

# Token ids per element: coarser than a KV block, so a long prompt stays cheap.
TOKENS_PER_BLOCK = TOKENS_PER_ELEMENT
CHARS_PER_TOKEN = 4  # what text's tokens are estimated at, for the placer's prefix cost rule
CHARS_PER_BLOCK = TOKENS_PER_BLOCK * CHARS_PER_TOKEN  # the same for text
# Elements at most, as many as the placer reads (8,192 tokens): past that, prompts that agree so far meet
# anyway.
MAX_CHAIN = MAX_PREFIX_CHAIN


class ChatKey(NamedTuple):
    """A chat's text for its chain. opening: every message up to the end of the first user message, one
    element, so a new conversation shares nothing with others that open with the same system prompt
    (they would otherwise all follow the last one placed); rest: the messages after it, in blocks."""

    opening: str
    rest: str


Prompt = str | Sequence[int] | ChatKey


class PromptHints(NamedTuple):
    """What the placer is told of a prompt."""

    chain: tuple[int, ...] = ()
    prompt_tokens: int = 0  # its token ids; 0 for text, whose token count only the worker knows
    # Where each chain element ends in the prompt, in tokens (text: at CHARS_PER_TOKEN characters one).
    chain_tokens: tuple[int, ...] = ()


NO_HINTS = PromptHints()  # a request with no prompt to place by (an embedding)


def hints_of(prompt: Prompt) -> PromptHints:
    """prompt's chain and where its elements end, and its length where it is token ids."""
    tokens = 0 if isinstance(prompt, (str, ChatKey)) else len(prompt)
    chain, ends = _chain(prompt)
    return PromptHints(chain, tokens, ends)


def chat_key(chat: inference_pb2.ChatInput) -> ChatKey:
    """chat's messages as text: each later turn of a conversation repeats the earlier ones, so its key
    extends theirs and its chain shares theirs up to where it adds its own messages."""
    opening: list[str] = []
    rest: list[str] = []
    into = opening
    for message in chat.messages:
        into += (message.role, "\x1f", message.name, "\x1f", message.content, "\x1f", message.tool_call_id)
        for call in message.tool_calls:
            into += ("\x1d", call.id, "\x1f", call.name, "\x1f", call.arguments)
        into.append("\x1e")
        if message.role == "user":
            into = rest
    return ChatKey("".join(opening), "".join(rest))


def prefix_chain(prompt: Prompt) -> tuple[int, ...]:
    """prompt's chain: a hash per block, each over the prompt from its start; () for an empty prompt."""
    return _chain(prompt)[0]


def _chain(prompt: Prompt) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prompt's chain, each element's end in tokens)."""
    hasher = hashlib.blake2b(digest_size=8)
    chain: list[int] = []
    ends: list[int] = []
    for block, end in _blocks(prompt):
        hasher.update(block)
        # 63 bits: the values travel as uint64 and sit in Python ints, and stay clear of a sign bit.
        chain.append(int.from_bytes(hasher.copy().digest(), "big") >> 1)
        ends.append(end)
        if len(chain) == MAX_CHAIN:
            break
    return tuple(chain), tuple(ends)


def _blocks(prompt: Prompt) -> Iterator[tuple[bytes, int]]:
    """(block, where it ends in the prompt in tokens) per block."""
    if isinstance(prompt, ChatKey):
        opening = len(prompt.opening)
        if prompt.opening:
            yield prompt.opening.encode(), _text_tokens(opening)
        yield from _text_blocks(prompt.rest, opening)
    elif isinstance(prompt, str):
        yield from _text_blocks(prompt, 0)
    else:
        for start in range(0, len(prompt), TOKENS_PER_BLOCK):
            block = prompt[start : start + TOKENS_PER_BLOCK]
            yield array("q", block).tobytes(), start + len(block)


def _text_blocks(text: str, before: int) -> Iterator[tuple[bytes, int]]:
    """text's blocks; before: characters of the prompt ahead of text."""
    for start in range(0, len(text), CHARS_PER_BLOCK):
        block = text[start : start + CHARS_PER_BLOCK]
        yield block.encode(), _text_tokens(before + start + len(block))


def _text_tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)
