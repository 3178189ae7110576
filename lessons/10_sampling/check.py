"""Checks for lesson 10: sample and sample_one."""

import math
from collections import Counter

import torch

from nanoengine.sampling_params import SamplingParams
from tracer.i18n import _
from tracer.teach.kit import (
    expect,
    expect_engine_matches,
    expect_no_violations,
    lesson_scenario,
)
from tracer.teach.scenarios import ScenarioError, run_scenario

TARGETS = {"sample": "sample", "sample_one": "sample_one"}


def draw_many(
    fns,
    logits: list[float],
    n: int = 600,
    seed: int = 7,
    one_token: bool = False,
    **params,
) -> Counter:
    """n seeded draws, one per num_tokens value: a sample of the distribution sample_one draws from."""
    row = torch.tensor(logits)
    p = SamplingParams(seed=seed, **params)
    counts = Counter()
    for num_tokens in range(n):
        token = fns.sample_one(row.clone(), p, num_tokens)
        expect(
            isinstance(token, int) and not isinstance(token, bool),
            _("sample_one must return a Python int, got {token!r}").format(
                token=token
            ),
        )
        expect(
            0 <= token < len(logits),
            _(
                "sample_one returned {token}, outside the vocabulary 0..{last}"
            ).format(token=token, last=len(logits) - 1),
        )
        counts[token] += 1
    top = torch.softmax(row / params.get("temperature", 1.0), -1).max().item()
    expect(
        len(counts) > 1 or top > 0.9 or one_token,
        _(
            "sample_one drew token {token} for all {n} values of "
            "num_tokens (seed {seed}), though no token has more than "
            "{top:.0%} of the probability: include num_tokens in the "
            "seed (p.seed * 1_000_003 + num_tokens), so each "
            "position gets its own draw"
        ).format(token=next(iter(counts)), n=n, seed=seed, top=top),
    )
    return counts


def check_sample_greedy(fns):
    """Greedy rows take the argmax; sample returns a list of Python ints, one per row."""
    logits = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 0.0], [0.0, 0.0, 9.0]])
    got = fns.sample(logits, [SamplingParams()] * 3, [4, 4, 4])
    expect(
        isinstance(got, list) and all(type(t) is int for t in got),
        _(
            "sample must return a list of Python ints "
            "(tensor.tolist()), got {got!r}"
        ).format(got=got),
    )
    expect(
        got == [1, 0, 2],
        _("greedy rows must take the argmax [1, 0, 2], got {got}").format(
            got=got
        ),
    )


def check_sample_calls_sample_one(fns):
    """Non-greedy rows are sampled (here from a uniform distribution), not argmaxed."""
    logits = torch.zeros(20, 8)
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(20)]
    got = fns.sample(logits, params, [3] * 20)
    expect(
        len(set(got)) > 2,
        _(
            "20 seeded requests drawing from a uniform distribution "
            "over 8 tokens gave {got}: the non-greedy rows must go "
            "through sample_one"
        ).format(got=got),
    )


def check_temperature(fns):
    """Temperature 1 draws with the softmax probabilities; a low temperature sharpens them."""
    logits = [2.0, 1.0, 0.0]
    counts = draw_many(fns, logits, temperature=1.0)
    p0 = math.exp(2) / (math.exp(2) + math.exp(1) + 1)
    share = counts[0] / 600
    expect(
        abs(share - p0) < 0.07,
        _(
            "with temperature 1 token 0 should be drawn ~{p0:.0%} of "
            "the time, it was {share:.0%}: softmax(logits / "
            "temperature)"
        ).format(p0=p0, share=share),
    )
    cold = draw_many(fns, logits, temperature=0.2)[0] / 600
    expect(
        cold > 0.95,
        _(
            "with temperature 0.2 token 0 should be drawn >95% of "
            "the time, it was {cold:.0%}"
        ).format(cold=cold),
    )


def check_top_k(fns):
    """top_k keeps only the k highest-scoring tokens."""
    counts = draw_many(fns, [0.0, 3.0, 1.0, 2.9, 0.5], temperature=2.0, top_k=2)
    expect(
        set(counts) == {1, 3},
        _(
            "top_k=2 may only draw tokens 1 and 3 (the two highest), drew {drawn}"
        ).format(drawn=dict(counts)),
    )


def check_top_p(fns):
    """top_p keeps the shortest run of top tokens whose probability reaches top_p."""
    logits = [math.log(x) for x in (0.5, 0.3, 0.15, 0.05)]
    for top_p, allowed in ((0.7, {0, 1}), (0.9, {0, 1, 2}), (0.45, {0})):
        counts = draw_many(
            fns,
            logits,
            n=400,
            one_token=len(allowed) == 1,
            temperature=1.0,
            top_p=top_p,
        )
        expect(
            set(counts) == allowed,
            _(
                "probabilities [0.5, 0.3, 0.15, 0.05] with top_p={top_p} "
                "may only draw {allowed}, drew {drawn}"
            ).format(top_p=top_p, allowed=sorted(allowed), drawn=dict(counts)),
        )


def check_seeded_draws_repeat(fns):
    """The same seed and num_tokens give the same token; another num_tokens may give another."""
    row = torch.zeros(50)
    p = SamplingParams(temperature=1.0, seed=11)
    first = [fns.sample_one(row.clone(), p, n) for n in range(10)]
    again = [fns.sample_one(row.clone(), p, n) for n in range(10)]
    expect(
        first == again,
        _(
            "seed 11 must give the same draws for num_tokens 0..9 "
            "every time: {first} vs {again}. Seed a torch.Generator "
            "with p.seed * 1_000_003 + num_tokens"
        ).format(first=first, again=again),
    )
    expect(
        len(set(first)) > 3,
        _(
            "uniform draws at 10 different num_tokens gave {first}: "
            "include num_tokens in the seed, so each position gets "
            "its own draw"
        ).format(first=first),
    )
    unseeded = fns.sample_one(row.clone(), SamplingParams(temperature=1.0), 0)
    expect(
        isinstance(unseeded, int) and 0 <= unseeded < 50,
        _("an unseeded draw returned {unseeded!r}").format(unseeded=unseeded),
    )


def engine_greedy_unchanged(fns):
    """In the engine, the greedy request matches the engine's own run."""
    expect_engine_matches(lesson_scenario(__file__), requests=[0])


def engine_seeds_survive_batching(fns):
    """A seeded request gives the same tokens run twice, and alone or in a batch."""
    scenario = lesson_scenario(__file__)
    try:
        first, second = run_scenario(scenario), run_scenario(scenario)
        expect_no_violations(first)
        alone = run_scenario(
            lesson_scenario(__file__, requests=scenario.requests[1:2])
        )
    except ScenarioError as e:
        raise AssertionError(str(e)) from None
    for i in (1, 2):
        expect(
            first.outputs[i].token_ids == second.outputs[i].token_ids,
            _(
                "request {i} (seeded) generated {token_ids} and then "
                "{token_ids2}: seeded sampling must repeat"
            ).format(
                i=i,
                token_ids=first.outputs[i].token_ids,
                token_ids2=second.outputs[i].token_ids,
            ),
        )
    expect(
        alone.outputs[0].token_ids == first.outputs[1].token_ids,
        _(
            "request 1 alone generated {token_ids} but {token_ids2} "
            "in the batch: its draws must not depend on the other "
            "requests (seed with its own seed and num_tokens)"
        ).format(
            token_ids=alone.outputs[0].token_ids,
            token_ids2=first.outputs[1].token_ids,
        ),
    )
    expect(
        first.outputs[1].token_ids != first.outputs[0].token_ids,
        _(
            "the sampled request generated exactly the greedy text: "
            "is temperature applied?"
        ),
    )
