"""A worker's per-token logprobs (GenerateResponse.logprobs) in OpenAI's two shapes.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`,
exactly top_logprobs alternatives per token. Completions (the legacy shape): parallel lists `tokens`,
`token_logprobs`, `top_logprobs` (per token a token -> logprob map of the alternatives and the sampled
token, so up to logprobs + 1 entries, as OpenAI documents) and `text_offset` (each token's character
offset in the choice's text, counted from its first token).
"""

from __future__ import annotations

from collections.abc import Sequence

from hanzo.inference.v1 import inference_pb2

Entries = Sequence[inference_pb2.TokenLogprobs]


def chat_logprobs(entries: Entries) -> dict[str, object]:
    return {
        "content": [
            {
                **_token(entry.token, entry.logprob),
                "top_logprobs": [_token(top.token, top.logprob) for top in entry.top_logprobs],
            }
            for entry in entries
        ]
    }


def completion_logprobs(entries: Entries, text_offset: int = 0) -> tuple[dict[str, object], int]:
    """The legacy logprobs object of entries whose first token starts at text_offset in the choice's
    text; also the offset after the last token (where a streamed choice's next chunk starts)."""
    offsets = []
    for entry in entries:
        offsets.append(text_offset)
        text_offset += len(entry.token)
    shape = {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [
            {**{top.token: top.logprob for top in entry.top_logprobs}, entry.token: entry.logprob}
            for entry in entries
        ],
        "text_offset": offsets,
    }
    return shape, text_offset


def _token(token: str, logprob: float) -> dict[str, object]:
    # bytes: the token's UTF-8 bytes, so a client can join tokens that each hold part of a character.
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
