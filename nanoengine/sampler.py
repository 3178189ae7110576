"""Turn each sequence's logits into its next token."""

from __future__ import annotations

import torch

from nanoengine.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams], num_tokens: list[int]) -> list[int]:
    """logits: [num_seqs, vocab]. num_tokens seeds each seeded request's draw, so a seeded
    request gives the same text whatever it was batched with (and after preemption)."""
    # the first largest, as argmax; on a CPU argmax takes 2-5x max's time (docs/benchmarks.md)
    tokens = logits.max(dim=-1).indices
    for i, p in enumerate(params):
        if not p.greedy:
            tokens[i] = sample_one(logits[i].float(), p, num_tokens[i])
    return tokens.tolist()


def sample_one(logits: torch.Tensor, p: SamplingParams, num_tokens: int) -> int:
    logits = logits / p.temperature
    if p.top_k > 0:
        kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Drop a token when the tokens ranked above it already reach top_p.
        drop = sorted_probs.cumsum(-1) - sorted_probs >= p.top_p
        probs = probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
    generator = None
    if p.seed is not None:
        generator = torch.Generator(device=logits.device)
        generator.manual_seed(p.seed * 1_000_003 + num_tokens)
    return int(torch.multinomial(probs, 1, generator=generator))
