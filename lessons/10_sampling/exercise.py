"""Lesson 10: sampling. Write sample and sample_one.

Check it:  nanoengine lesson check 10
Watch it:  nanoengine lesson trace 10
"""

from __future__ import annotations

import torch

from nanoengine.sampling_params import SamplingParams


def sample(
    logits: torch.Tensor, params: list[SamplingParams], num_tokens: list[int]
) -> list[int]:
    """One token per row of logits ([num_seqs, vocab]): argmax for greedy
    requests (p.greedy), sample_one(logits[i].float(), p, num_tokens[i]) for the
    others. Returns Python ints."""
    # TODO
    raise NotImplementedError("sample is not written yet")


def sample_one(logits: torch.Tensor, p: SamplingParams, num_tokens: int) -> int:
    """Draw one token from one row of logits ([vocab]) with p.temperature (> 0),
    p.top_k (0 = off), p.top_p (1.0 = off) and p.seed (None = unseeded;
    otherwise seed a torch.Generator with p.seed * 1_000_003 + num_tokens)."""
    # TODO: temperature, top-k mask, softmax, top-p mask,
    #       torch.multinomial(probs, 1, generator=...).
    raise NotImplementedError("sample_one is not written yet")
