"""Log-probabilities a request asked for: of each sampled token and of each prompt token.

Taken from the model's raw logits, before temperature, penalties or any other sampling parameter
changes them (vLLM's default, "raw_logprobs"): they say what the model thought, not what the
sampler did. Each entry holds the chosen token and the k likeliest, with their ranks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoengine.sequence import Logprob, Sequence, TopLogprobs


@dataclass(slots=True)
class Sampled:
    """One sequence's result of a step."""

    token_id: int
    logprobs: TopLogprobs | None = None  # asked for, and the token is kept (not mid-prefill)
    prompt_logprobs: dict[int, TopLogprobs] | None = None  # prompt index -> entry, when asked for


def top_logprobs(row: torch.Tensor, token_id: int, k: int) -> TopLogprobs:
    """row: [vocab] logprobs. The chosen token (with its rank) and the k likeliest."""
    chosen = row[token_id]
    top = {token_id: Logprob(float(chosen), int((row > chosen).sum()) + 1)}
    values, ids = row.topk(k)
    for rank, (t, v) in enumerate(zip(ids.tolist(), values.tolist()), start=1):
        top.setdefault(t, Logprob(v, rank))
    return top


def sampled_logprobs(
    logprobs: torch.Tensor | None, seqs: list[Sequence], token_ids: list[int], discard: list[bool]
) -> list[Sampled]:
    """logprobs: [num_seqs, vocab] of the raw logits, None when no sequence asked for them.
    discard: the rows of sequences mid-prefill, whose token is thrown away (no entry for them)."""
    results = []
    for i, (seq, token_id) in enumerate(zip(seqs, token_ids)):
        k = seq.params.logprobs
        if logprobs is None or k is None or discard[i]:
            results.append(Sampled(token_id))
        else:
            results.append(Sampled(token_id, top_logprobs(logprobs[i], token_id, k)))
    return results


def prompt_logprobs(logits: torch.Tensor, seq: Sequence) -> dict[int, TopLogprobs]:
    """logits: [num_scheduled, vocab] at this prefill chunk's positions. The token at position
    p + 1 is scored by the logits at p; the prompt's last position predicts the first output."""
    k = seq.params.prompt_logprobs
    assert k is not None
    entries = {}
    for j, row in enumerate(logits.float().log_softmax(-1)):
        index = seq.num_cached_tokens + j + 1  # the prompt token this row scores
        if index < seq.num_prompt_tokens:
            entries[index] = top_logprobs(row, seq.token_ids[index], k)
    return entries
