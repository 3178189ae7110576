"""What a request gives back, in vLLM's shape: a RequestOutput with one CompletionOutput per
sequence (its n samples), and where a text stops."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nanoengine.sequence import FinishReason, Logprob, Sequence, TopLogprobs

ERROR = FinishReason.ERROR


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

    # One sequence's fields, as before there were several: outputs[0]'s.
    @property
    def seq_id(self) -> int:
        return self.request_id

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def error(self) -> str:
        return self.outputs[0].error


def output_of(seqs: list[Sequence], tokenizer: Any) -> RequestOutput:
    first = seqs[0]
    prompt_logprobs = None
    if first.params.prompt_logprobs is not None:
        prompt_logprobs = [e and decoded(e, tokenizer) for e in first.prompt_logprobs]
    outputs = [completion_of(i, seq, tokenizer) for i, seq in enumerate(seqs)]
    prompt_ids = first.token_ids[: first.num_prompt_tokens]
    return RequestOutput(first.request_id, first.prompt, prompt_ids, prompt_logprobs, outputs)


def beam_output_of(seqs: list[Sequence], best: list[Any], tokenizer: Any) -> RequestOutput:
    """A beam search's best hypotheses (BeamSearchSequence) as its outputs; the EOS that ended
    one is in its token ids, not its text."""
    first = seqs[0]
    cut = first.num_prompt_tokens
    ended = [s.finish_reason for s in seqs if s.finish_reason in (FinishReason.ABORT, ERROR)]
    outputs = []
    for i, h in enumerate(best):
        tokens = h.tokens[cut:]
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        logprobs = [decoded(e, tokenizer) for e in h.logprobs]
        reason = ended[0].value if ended else h.finish_reason
        outputs.append(CompletionOutput(i, text, tokens, h.cum_logprob, logprobs, reason))
    return RequestOutput(first.request_id, first.prompt, first.token_ids[:cut], None, outputs)


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
