import torch

from nanoengine import LLM, SamplingParams
from nanoengine.sampler import sample


def test_greedy_top_k_1_and_tiny_top_p_pick_the_argmax():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    greedy = logits.argmax(-1).tolist()
    params = [
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=0.7, top_p=1e-6),
        SamplingParams(),
        SamplingParams(temperature=2.0, top_k=1, seed=3),
    ]
    assert sample(logits, params, [5, 5, 5, 5]) == greedy


def test_top_k_restricts_choices():
    logits = torch.arange(10, dtype=torch.float32)[None].repeat(200, 1)
    picks = sample(logits, [SamplingParams(temperature=5.0, top_k=3)] * 200, list(range(200)))
    assert set(picks) <= {7, 8, 9} and len(set(picks)) > 1


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].repeat(300, 1)
    picks = sample(logits, [SamplingParams(temperature=1.0, top_p=0.75)] * 300, list(range(300)))
    assert set(picks) == {0, 1}


def test_seed_reproducible_and_independent_of_batch():
    llm = LLM("tiny")
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_tokens=12, ignore_eos=True)
    alone = llm.generate(["hello"], params)[0].token_ids
    batched = llm.generate(["other prompt", "hello", "x"], params)[1].token_ids
    assert alone == batched
    different = llm.generate(["hello"], SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True))[
        0
    ].token_ids
    assert different != alone


def test_greedy_takes_the_first_of_tied_largest_logits_as_argmax_does():
    """bfloat16 logits tie often; greedy must pick what vLLM's argmax picks, the first of them."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randint(-3, 4, (8, 1000), generator=gen).to(dtype)  # every row has ties
        logits[3, 7] = float("nan")  # argmax takes a NaN as the largest
        params = [SamplingParams(temperature=0)] * 8
        assert sample(logits, params, [0] * 8) == logits.argmax(dim=-1).tolist()
