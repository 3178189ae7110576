"""The few-row linear (tracer/kernels/packed_gemv.c): on oneDNN's packed weight it gives oneDNN's
bits, and it is trusted with a row count only after showing that at its first call."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoengine.loading.build import pack_for_onednn
from nanoengine.model import ONEDNN, Linear
from tracer.kernels import packed_linear
from tracer.kernels.packed_linear import MAX_ROWS, Agreement, FewRowsLinear, few_rows_first

pytestmark = pytest.mark.skipif(not ONEDNN, reason="oneDNN's packed layout exists on x86 builds of torch")


def packed_linear_of(in_features: int, out_features: int, bias: bool, seed: int) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    linear = Linear(in_features, out_features, bias=bias)
    linear.weight.data = torch.randn(out_features, in_features, generator=gen) * 0.1
    if bias:
        linear.bias.data = torch.randn(out_features, generator=gen)
    pack_for_onednn(linear)
    return linear


def kernel_first(linear: Linear) -> FewRowsLinear:
    matmul = few_rows_first(linear, {})
    assert isinstance(matmul, FewRowsLinear)
    return matmul


@settings(max_examples=40, deadline=None)
@given(
    in_features=st.sampled_from([8, 36, 64, 576, 1100, 1536, 2100]),
    out_features=st.sampled_from([8, 64, 100, 259, 960]),
    bias=st.booleans(),
    rows=st.integers(1, MAX_ROWS),
    seed=st.integers(0, 99),
)
def test_a_few_rows_get_onednns_bits_from_the_kernel(in_features, out_features, bias, rows, seed):
    """Inputs past 1024 are summed in chunks, as oneDNN sums them; outputs past a block of 64 and
    inputs past a multiple of 16 meet the packed layout's zero padding."""
    linear = packed_linear_of(in_features, out_features, bias, seed)
    matmul = kernel_first(linear)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(seed + 1))
    with torch.inference_mode():
        expected = linear(x)
        assert torch.equal(matmul(x), expected)  # the first call compares the two
        assert matmul.agreement.rows == {rows: True}
        assert torch.equal(matmul(x), expected)  # the second runs the kernel alone
        assert torch.equal(matmul.kernel(x, matmul.agreement.chunk), expected)


def test_a_kernel_that_disagrees_is_never_used(monkeypatch):
    """A planted bug: the chunks tried are all wrong for 1536 inputs (oneDNN sums 1024 at a time
    here). The first call gives oneDNN's result, and every later one too."""
    monkeypatch.setattr(packed_linear, "CHUNKS", (512,))
    linear = packed_linear_of(1536, 128, False, 0)
    matmul = kernel_first(linear)
    x, zeros = torch.randn(2, 1536), torch.zeros(2, 1536)
    with torch.inference_mode():
        assert torch.equal(matmul.kernel(zeros, 512), linear(zeros))  # rows of zeros cannot tell
        assert torch.equal(matmul(zeros), linear(zeros))  # the first call compares on random rows
        expected = linear(x)
        assert not torch.equal(matmul.kernel(x, 512), expected)
        assert torch.equal(matmul(x), expected)
    assert matmul.agreement.rows == {2: False}


def test_a_wrong_layout_is_caught_by_the_first_call():
    """A planted bug: the padded row of inputs one 16 too long, so every block is read askew."""
    linear = packed_linear_of(100, 128, True, 0)
    right = kernel_first(linear)
    in_features, in_padded, out_features, bias = right.shape
    askew = FewRowsLinear(
        right.forward,
        right.weight,
        right.address,
        right.bias,
        (in_features, in_padded + 16, out_features, bias),
        Agreement(),
    )
    x = torch.randn(1, 100)
    with torch.inference_mode():
        assert torch.equal(askew(x), linear(x))
        assert askew.agreement.rows == {1: False}
        assert torch.equal(askew(x), linear(x))


def test_linears_of_one_shape_share_what_the_first_showed():
    agreements: dict = {}
    first, second = (few_rows_first(packed_linear_of(64, 64, False, seed), agreements) for seed in (0, 1))
    assert isinstance(first, FewRowsLinear) and isinstance(second, FewRowsLinear)
    with torch.inference_mode():
        first(torch.randn(3, 64))
    assert second.agreement.rows == {3: True} and len(agreements) == 1


def test_more_rows_go_to_onednn_unchecked():
    linear = packed_linear_of(64, 64, False, 0)
    matmul = kernel_first(linear)
    x = torch.randn(MAX_ROWS + 1, 64)
    with torch.inference_mode():
        assert torch.equal(matmul(x), linear(x))
    assert matmul.agreement.rows == {}


def test_weights_not_packed_in_float32_keep_the_linears_forward():
    plain = Linear(64, 64)
    assert few_rows_first(plain, {}) == plain.forward
    bf16 = Linear(64, 64).to(torch.bfloat16)
    pack_for_onednn(bf16)  # packed only where oneDNN has bf16 kernels; either way not float32
    assert few_rows_first(bf16, {}) == bf16.forward
