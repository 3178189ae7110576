"""What a request gives back: its text and tokens, and where its text stops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nanoengine.sequence import Sequence


@dataclass(slots=True)
class RequestOutput:
    seq_id: int
    prompt: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str = ""  # why it failed, when finish_reason is 'error'


def output_of(seq: Sequence, tokenizer: Any) -> RequestOutput:
    text = tokenizer.decode(seq.completion_token_ids, skip_special_tokens=True)
    for s in seq.params.stop:
        if s in text:  # cut at the first stop string
            text = text[: text.index(s)]
    reason = seq.finish_reason.value if seq.finish_reason else None
    prompt_ids = seq.token_ids[: seq.num_prompt_tokens]
    return RequestOutput(
        seq.seq_id, seq.prompt, prompt_ids, seq.completion_token_ids, text, reason, seq.error
    )


def stop_string_in_tail(seq: Sequence, tokenizer: Any) -> bool:
    """Does the newest text hold a stop string? Decodes just enough last tokens for the longest
    one plus 4 characters (the first may be cut mid-character): from 1 token per character,
    doubling up to 4 (bytes), so the cost depends on the stop strings, not the completion."""
    need = max(len(s) for s in seq.params.stop) + 4
    limit = min(4 * need, seq.num_completion_tokens)
    n = min(need, limit)
    while True:
        tail = tokenizer.decode(seq.token_ids[-n:], skip_special_tokens=True)
        if len(tail) >= need or n >= limit:
            return any(s in tail for s in seq.params.stop)
        n = min(2 * n, limit)
