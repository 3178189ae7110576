"""The engine's logprobs in OpenAI's two response shapes.

The engine gives, per token, a dict token id -> Logprob(logprob, rank): the chosen token and the k
likeliest, from the model's raw logits (before temperature or penalties, vLLM's default). A prompt's
first token has no entry (None): nothing comes before it.

Completions (the legacy shape, what lm-eval reads), one list entry per token of the choice's text
(with echo, the prompt's tokens first):

    "logprobs": {"tokens": [" Paris", "."], "token_logprobs": [-0.4, -1.2],
                 "top_logprobs": [{" Paris": -0.4, " Lyon": -2.1}, ...], "text_offset": [0, 6]}

Chat, one entry per output token:

    "logprobs": {"content": [{"token": " Paris", "logprob": -0.4, "bytes": [32, 80, ...],
                              "top_logprobs": [{"token": " Paris", "logprob": -0.4, "bytes": [...]}, ...]}]}

A token's text is the tokenizer's decoding of that token alone (vLLM's); a byte that is only part of
a character decodes to U+FFFD. -inf (a token the model rules out) is written -9999.0, as vLLM does:
JSON has no infinity.
"""

from __future__ import annotations

import math
from typing import Any

from nanoengine.sequence import Logprob, TopLogprobs

NO_CHANCE = -9999.0


def finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else NO_CHANCE


def by_rank(entry: TopLogprobs) -> list[tuple[int, Logprob]]:
    """The entry's tokens, likeliest first (the chosen one among them where its rank puts it)."""
    return sorted(entry.items(), key=lambda item: (item[1].rank, item[0]))


class TokenTexts:
    """Each token id's text, decoded once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if token_id not in self.texts:
            self.texts[token_id] = self.tokenizer.decode([token_id])
        return self.texts[token_id]


def legacy_logprobs(token_ids: list[int], entries: list[TopLogprobs | None], text: TokenTexts, offset: int = 0) -> dict:
    """The completions shape for these tokens; offset: where the first token's text starts in the
    choice's text (a streamed chunk continues where the last one ended)."""
    tokens = [text(t) for t in token_ids]
    token_logprobs = [None if e is None else finite(e[t].logprob) for t, e in zip(token_ids, entries)]
    top = [None if e is None else legacy_top(e, text) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def legacy_top(entry: TopLogprobs, text: TokenTexts) -> dict[str, float]:
    """token text -> logprob, likeliest first; two tokens with the same text (bytes of different
    characters both decode to U+FFFD) keep the likelier one's logprob."""
    top: dict[str, float] = {}
    for token_id, lp in by_rank(entry):
        top.setdefault(text(token_id), finite(lp.logprob))
    return top


def chat_logprobs(token_ids: list[int], entries: list[TopLogprobs], text: TokenTexts, k: int) -> dict:
    """The chat shape: each output token with the k likeliest (top_logprobs k)."""
    content = []
    for token_id, entry in zip(token_ids, entries):
        top = [lp_item(text(t), lp) for t, lp in by_rank(entry) if lp.rank <= k][:k]
        content.append(lp_item(text(token_id), entry[token_id]) | {"top_logprobs": top})
    return {"content": content}


def lp_item(token: str, lp: Logprob) -> dict:
    return {"token": token, "logprob": finite(lp.logprob), "bytes": list(token.encode("utf-8", errors="replace"))}


def prompt_logprobs_entries(entries: list[TopLogprobs | None], text: TokenTexts) -> list[dict | None]:
    """vLLM's prompt_logprobs field: per prompt token, token id -> {logprob, rank, decoded_token}."""
    return [
        None
        if e is None
        else {str(t): {"logprob": finite(lp.logprob), "rank": lp.rank, "decoded_token": text(t)} for t, lp in e.items()}
        for e in entries
    ]
