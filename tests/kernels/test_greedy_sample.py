"""Greedy sampling's pick compiled (tracer/kernels/greedy_sample.c): each row's first largest logit,
the very token the engine's own sampler picks (torch's max(dim=-1).indices), ties, infinities and
ragged vocabularies included; anything else goes to the engine's sampler."""

from __future__ import annotations

import pytest
import torch
from conftest import BUSY_OPTIONS, BUSY_REQUESTS, drive
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoengine.engine import LLMEngine
from nanoengine.sampler import sample
from nanoengine.sampling_params import SamplingParams
from tracer.kernels import greedy_sample
from tracer.kernels.choose import build_engine
from tracer.kernels.greedy_sample import first_largest, sample_compiled

DTYPES = st.sampled_from([torch.float32, torch.bfloat16])
GREEDY = SamplingParams(temperature=0)


def torchs_pick(logits: torch.Tensor) -> torch.Tensor:
    return logits.max(dim=-1).indices


def busy_tokens(engine: LLMEngine) -> list[list[int]]:
    """BUSY_REQUESTS (greedy: the default), each arriving at its step: every request's tokens."""
    return [engine.collect(i).outputs[0].token_ids for i in drive(engine, BUSY_REQUESTS, 200)]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 40),
    vocab=st.sampled_from([1, 7, 31, 32, 33, 100, 1000, 49152]),
    dtype=DTYPES,
    ties=st.integers(0, 3),
    seed=st.integers(0, 999),
)
def test_each_rows_first_largest_logit_is_torchs_pick(rows, vocab, dtype, ties, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen).mul(4).to(dtype)
    for row in range(rows):  # the largest again, later in the row: the first must win
        top = logits[row].max()
        spots = torch.randint(0, vocab, (ties,), generator=gen)
        logits[row, spots] = top
    assert torch.equal(first_largest(logits), torchs_pick(logits))


def test_ties_infinities_and_the_last_logit_are_torchs_pick():
    vocab = 49152
    logits = torch.zeros(6, vocab)
    logits[0, [5, 9, vocab - 1]] = 1.0  # a tie: the first
    logits[1] = float("-inf")  # nothing but -inf: the first
    logits[2, [40, 41]] = float("inf")
    logits[3, vocab - 1] = 2.0  # the very last logit, past the last whole run of lanes
    logits[4] = -1.0
    logits[4, 33] = -0.5
    logits[5, 0] = 3.0  # the very first
    for dtype in (torch.float32, torch.bfloat16):
        x = logits.to(dtype)
        assert first_largest(x).tolist() == torchs_pick(x).tolist() == [5, 0, 40, vocab - 1, 33, 0]


def test_a_row_with_a_nan_is_left_to_torch():
    logits = torch.randn(3, 100)
    logits[1, [20, 70]] = float("nan")
    assert first_largest(logits).tolist()[1] == -1
    params = [GREEDY] * 3
    assert sample_compiled(logits, params, [1, 1, 1]) == sample(logits, params, [1, 1, 1])


@pytest.mark.parametrize(
    "logits",
    [
        torch.randn(4, 64).t(),  # not contiguous
        torch.randn(4, 64, dtype=torch.float64),
        torch.randn(4, 64).half(),
    ],
)
def test_logits_the_kernel_does_not_take_go_to_the_engines_sampler(monkeypatch, logits):
    def planted(_):
        raise AssertionError("the kernel was handed logits it does not take")

    monkeypatch.setattr(greedy_sample, "first_largest", planted)
    params = [GREEDY] * len(logits)
    assert sample_compiled(logits, params, [1] * len(logits)) == sample(logits, params, [1] * len(logits))


def test_a_batch_with_a_sampled_request_goes_to_the_engines_sampler(monkeypatch):
    """A seeded draw gives the same token as the engine's sampler, because it is the engine's."""
    logits = torch.randn(3, 500)
    params = [GREEDY, SamplingParams(temperature=0.8, seed=7), GREEDY]
    expected = sample(logits, params, [4, 4, 4])
    monkeypatch.setattr(greedy_sample, "first_largest", lambda _: torch.zeros(3, dtype=torch.int64))
    assert sample_compiled(logits, params, [4, 4, 4]) == expected


def test_the_tools_engine_samples_through_the_kernel_and_picks_the_engines_tokens(monkeypatch):
    """The engine the tools build swaps its sampler for the compiled one; the same busy workload
    gives the same tokens either way, and a planted off-by-one in the kernel's pick must show."""
    engine = build_engine("tiny", dict(BUSY_OPTIONS))
    assert engine.runner.sampler is sample_compiled
    ours = busy_tokens(engine)
    textbook = build_engine("tiny", dict(BUSY_OPTIONS))
    textbook.runner.sampler = sample
    assert ours == busy_tokens(textbook)

    real = greedy_sample.first_largest
    monkeypatch.setattr(greedy_sample, "first_largest", lambda logits: (real(logits) + 1) % logits.shape[1])
    assert busy_tokens(build_engine("tiny", dict(BUSY_OPTIONS))) != ours


def test_the_textbook_path_keeps_the_engines_sampler():
    assert build_engine("tiny", {"attention_backend": "torch"}).runner.sampler is sample
