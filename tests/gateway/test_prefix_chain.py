"""The prefix chain the gateway sends the placer: prompts that agree up to a block's end share the chain
up to that element and no further, a conversation's later turns extend its earlier ones, and the values
are the same in every process."""

from __future__ import annotations

import subprocess
import sys

from hanzo.inference.v1 import inference_pb2
from services.gateway.prefix_chain import (
    CHARS_PER_BLOCK,
    MAX_CHAIN,
    TOKENS_PER_BLOCK,
    ChatKey,
    PromptHints,
    hints_of,
    prefix_chain,
)
from services.gateway.validate import validate_generate

SYSTEM = inference_pb2.ChatMessage(role="system", content="You are a travel agent. " * 40)


def message(role: str, content: str) -> inference_pb2.ChatMessage:
    return inference_pb2.ChatMessage(role=role, content=content)


def chain_of(*messages: inference_pb2.ChatMessage) -> tuple[int, ...]:
    request = inference_pb2.GenerateRequest(model="m", chat=inference_pb2.ChatInput(messages=messages))
    return prefix_chain(validate_generate(request))


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading elements a and b have in common."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_token_prompts_share_the_blocks_they_agree_on() -> None:
    tools = list(range(1000, 1000 + 3 * TOKENS_PER_BLOCK + 40))  # three whole blocks and part of a fourth
    session_a = tools + list(range(7, 300))
    session_b = tools + list(range(9, 300))
    a, b = prefix_chain(session_a), prefix_chain(session_b)
    assert len(a) == -(-len(session_a) // TOKENS_PER_BLOCK)  # the last, partial block included
    assert shared(a, b) == 3  # the tools' whole blocks; the fourth mixes in each session's own task
    next_turn = prefix_chain(session_a + list(range(500, 900)))
    assert shared(a, next_turn) == len(session_a) // TOKENS_PER_BLOCK  # all but a's partial last block
    assert len(set(a)) == len(a)


def test_text_prompts_are_cut_every_block_of_characters() -> None:
    text = "x" * (2 * CHARS_PER_BLOCK + 10)
    chain = prefix_chain(text)
    assert len(chain) == 3
    assert shared(chain, prefix_chain(text + "more")) == 2
    assert prefix_chain(text[:100]) != prefix_chain(text[:101])
    assert prefix_chain("") == ()


def test_a_conversations_later_turns_extend_its_chain_and_others_share_nothing() -> None:
    paris, rome = message("user", "Weather in Paris?"), message("user", "Weather in Rome?")
    turn1 = chain_of(SYSTEM, paris)
    assert len(turn1) == 1  # the opening, through the first user message, is one element
    long_reply = message("assistant", "Sunny and mild. " * 80)
    turn2 = chain_of(SYSTEM, paris, long_reply, message("user", "And tomorrow?"))
    assert turn2[:1] == turn1 and len(turn2) > 2
    turn3 = chain_of(SYSTEM, paris, long_reply, message("user", "And tomorrow?"), long_reply, rome)
    assert shared(turn2, turn3) == len(turn2) - 1  # every element but turn 2's partial last block
    # Another conversation with the same system prompt shares nothing: a new conversation is placed by
    # load, not sent after whichever conversation with that system prompt went last.
    assert shared(turn1, chain_of(SYSTEM, rome)) == 0


def test_tool_calls_are_part_of_the_key() -> None:
    def call(arguments: str) -> inference_pb2.ChatMessage:
        made = inference_pb2.ToolCall(id="c1", name="search", arguments=arguments)
        return inference_pb2.ChatMessage(role="assistant", tool_calls=[made])

    user = message("user", "Find flights")
    assert chain_of(user, call('{"to": "Paris"}')) != chain_of(user, call('{"to": "Rome"}'))


def test_a_long_prompt_is_cut_at_the_most_the_placer_reads() -> None:
    long = list(range(TOKENS_PER_BLOCK * (MAX_CHAIN + 10)))
    assert len(prefix_chain(long)) == MAX_CHAIN
    ends = tuple(TOKENS_PER_BLOCK * (i + 1) for i in range(MAX_CHAIN))
    assert hints_of(long) == PromptHints(prefix_chain(long), len(long), ends)
    assert hints_of("text").prompt_tokens == 0  # its token count is the worker's to know


def test_each_element_says_where_it_ends_in_tokens() -> None:
    # Token ids end exactly; the last block may be short.
    assert hints_of(list(range(300))).chain_tokens == (128, 256, 300)
    # Text at four characters a token, rounded up.
    assert hints_of("x" * 1030).chain_tokens == (128, 256, 258)
    # A chat's opening is one element of whatever length, the rest counted from its end.
    key = ChatKey("o" * 2000, "r" * 600)
    assert hints_of(key).chain_tokens == (500, 628, 650)
    assert len(hints_of(key).chain) == 3


def test_the_chain_is_the_same_in_another_process() -> None:
    """Every gateway replica must send the same chain for the same prompt; Python's own hash() would not."""
    code = "from services.gateway.prefix_chain import prefix_chain; print(prefix_chain('hello' * 300))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(prefix_chain("hello" * 300))
