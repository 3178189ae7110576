"""What a request gives back, in vLLM's shape: a RequestOutput with one CompletionOutput per
sequence (its n samples), and where a text stops."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nanoengine.sequence import Logprob, Sequence, TopLogprobs


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None  # None unless logprobs were asked for
    logprobs: list[TopLogprobs] | None  # per token, when asked for
    finish_reason: str | None
    error: str = ""  # why it failed, when finish_reason is 'error'


@dataclass(slots=True)
class RequestOutput:
    request_id: int
    prompt: str
    prompt_token_ids: list[int]
    prompt_logprobs: list[TopLogprobs | None] | None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True

    @property
    def seq_id(self) -> int:
        return self.request_id

    def __getattr__(self, name: str) -> Any:
        """One sequence's fields (text, token_ids, finish_reason, error), as before there were
        several: outputs[0]'s."""
        return getattr(self.outputs[0], name)


def output_of(seqs: list[Sequence], tokenizer: Any) -> RequestOutput:
    first = seqs[0]
    prompt_logprobs = None
    if first.params.prompt_logprobs is not None:
        prompt_logprobs = [e and decoded(e, tokenizer) for e in first.prompt_logprobs]
    outputs = [completion_of(i, seq, tokenizer) for i, seq in enumerate(seqs)]
    prompt_ids = first.token_ids[: first.num_prompt_tokens]
    return RequestOutput(first.request_id, first.prompt, prompt_ids, prompt_logprobs, outputs)


def completion_of(index: int, seq: Sequence, tokenizer: Any) -> CompletionOutput:
    text = tokenizer.decode(seq.completion_token_ids, skip_special_tokens=True)
    for s in seq.params.stop:
        if s in text:  # cut at the first stop string
            text = text[: text.index(s)]
    reason = seq.finish_reason.value if seq.finish_reason else None
    asked = seq.params.logprobs is not None
    logprobs = [decoded(e, tokenizer) for e in seq.logprobs] if asked else None
    cumulative = seq.cumulative_logprob if asked else None
    return CompletionOutput(
        index, text, seq.completion_token_ids, cumulative, logprobs, reason, seq.error
    )


def decoded(entry: TopLogprobs, tokenizer: Any) -> TopLogprobs:
    """The entry with each token's text, as vLLM's Logprob.decoded_token."""
    return {t: Logprob(lp.logprob, lp.rank, tokenizer.decode([t])) for t, lp in entry.items()}


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
