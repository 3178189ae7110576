"""What a request's sampling params do to its logits before a token is drawn, in vLLM v1's order:
min_tokens and logit_bias, then the penalties, then min_p (at the request's temperature), then
the request's own logits_processors.

A request whose params are all neutral is not touched, so a plain batch pays nothing."""

from __future__ import annotations

import torch

from nanoengine.sampling_params import SamplingParams
from nanoengine.sequence import Sequence


def changes_logits(p: SamplingParams) -> bool:
    penalized = p.repetition_penalty != 1 or p.frequency_penalty or p.presence_penalty
    min_p = p.min_p and not p.greedy
    return bool(p.min_tokens or p.logit_bias or penalized or min_p or p.logits_processors)


def process_logits(
    logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: frozenset[int]
) -> torch.Tensor:
    """logits: [num_seqs, vocab], changed in place where a request's params say so."""
    for row, seq in zip(logits, seqs):
        p = seq.params
        if not changes_logits(p):
            continue
        if seq.num_completion_tokens < p.min_tokens:  # too early to stop
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            row[sorted(stops)] = float("-inf")
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=row.device)
            row.index_add_(0, ids, torch.tensor(list(p.logit_bias.values())).to(row))
        apply_penalties(row, seq)
        if p.min_p and not p.greedy:
            probs = (row / p.temperature).softmax(-1)
            row[probs < p.min_p * probs.max()] = float("-inf")
        for fn in p.logits_processors:
            row.copy_(fn(seq.completion_token_ids, row))
    return logits


def apply_penalties(row: torch.Tensor, seq: Sequence) -> None:
    """vLLM's definitions: repetition over the prompt and the output (a positive logit is divided
    by it, a negative one multiplied), frequency and presence over the output only."""
    p = seq.params
    if p.repetition_penalty != 1:
        seen = torch.tensor(sorted(set(seq.token_ids)), device=row.device)
        logit = row[seen]
        row[seen] = torch.where(
            logit > 0, logit / p.repetition_penalty, logit * p.repetition_penalty
        )
    if (p.frequency_penalty or p.presence_penalty) and seq.num_completion_tokens:
        output = torch.tensor(seq.completion_token_ids, device=row.device)
        counts = torch.bincount(output, minlength=row.numel()).to(row)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row)
