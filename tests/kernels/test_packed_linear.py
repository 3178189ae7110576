"""The few-row linears (tracer/kernels/packed_gemv.c, float32; amx_gemv.c, bfloat16 on AMX;
dpbf16_gemv.c, bfloat16 with AVX512_BF16 and no AMX): on
oneDNN's packed weight they give oneDNN's bits, and each is trusted with a row count only after
showing that at its first call."""

from __future__ import annotations

import ctypes

import pytest
import torch
from conftest import torch_threads
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nanoengine.loading.build import pack_for_onednn
from nanoengine.model import ONEDNN, Linear
from tracer.kernels import packed_linear
from tracer.kernels.build import AVX2_ONLY, has_avx2
from tracer.kernels.packed_linear import (
    CHUNKS,
    DPBF16_MAX_ROWS,
    MAX_ROWS,
    Agreement,
    FewRowsLinear,
    Shape,
    agree_all,
    amx_ready,
    bf16_kernel_ready,
    cancelling_rows,
    few_rows_first,
    kernel_shape,
    packed_gemv_library,
    run_kernel,
)

pytestmark = pytest.mark.skipif(not ONEDNN, reason="oneDNN's packed layout exists on x86 builds of torch")


def packed_linear_of(in_features: int, out_features: int, bias: bool, seed: int, dtype=torch.float32) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    linear = Linear(in_features, out_features, bias=bias, dtype=dtype)
    linear.weight.data = (torch.randn(out_features, in_features, generator=gen) * 0.1).to(dtype)
    if bias:
        linear.bias.data = torch.randn(out_features, generator=gen).to(dtype)
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
@example(in_features=1536, out_features=259, bias=True, rows=1, seed=3)  # one row: its own loop
@example(in_features=1536, out_features=259, bias=True, rows=2, seed=3)
@example(in_features=2100, out_features=8, bias=False, rows=1, seed=67)  # split, rounds as one sum
def test_a_few_rows_get_onednns_bits_from_the_kernel(in_features, out_features, bias, rows, seed):
    """Inputs past 1024 are summed in chunks, as oneDNN sums them; outputs past a block of 64 and
    inputs past a multiple of 16 meet the packed layout's zero padding. Where oneDNN splits each
    output's sum among its threads (seen at 2,100 inputs, <= 64 outputs, 1 row, 2 threads on the
    Xeon of 2026-12-03), no sum in order gives its bits: the check keeps oneDNN, and at one thread,
    where oneDNN sums in order, the kernel gives them."""
    linear = packed_linear_of(in_features, out_features, bias, seed)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(seed + 1))
    with torch.inference_mode():
        if splits_among_threads(linear, x):
            assert kernel_first(linear).agree(rows) == 0  # no chunk gives bits summed in parts
            with torch_threads(1):
                assert_kernel_gives_onednns_bits(linear, x)
        else:
            assert_kernel_gives_onednns_bits(linear, x)


def assert_kernel_gives_onednns_bits(linear: Linear, x: torch.Tensor) -> None:
    matmul = kernel_first(linear)
    expected = linear(x)
    assert torch.equal(matmul(x), expected)  # the first call compares the two
    chunk = matmul.agreement.rows[x.shape[0]]
    assert chunk in packed_linear.CHUNKS
    assert torch.equal(matmul(x), expected)  # the second runs the kernel alone
    assert torch.equal(matmul.kernel(x, chunk), expected)


def splits_among_threads(linear: Linear, x: torch.Tensor) -> bool:
    """Whether oneDNN's bits for inputs of x's shape change with its thread count (it then sums each
    output in parts). Asked of x and seven more: a sum in two parts often rounds as the sum in one,
    and all eight outputs of one x did (2,100 inputs, seed 67)."""
    gen = torch.Generator().manual_seed(0)
    for probe in [x, *(torch.randn(x.shape, generator=gen) for _ in range(7))]:
        with torch_threads(1):
            alone = linear(probe)
        if not torch.equal(linear(probe), alone):
            return True
    return False


@pytest.mark.skipif(not has_avx2(), reason="the AVX2 build needs AVX2 and FMA")
@settings(max_examples=30, deadline=None)
@given(
    in_features=st.sampled_from([36, 100, 576, 1100, 1536]),
    out_features=st.sampled_from([8, 100, 259, 576, 960]),
    bias=st.booleans(),
    rows=st.integers(1, MAX_ROWS),
    seed=st.integers(0, 99),
)
@example(in_features=1536, out_features=259, bias=True, rows=5, seed=3)  # the fewest rows in tiles
@example(in_features=1100, out_features=960, bias=False, rows=64, seed=5)  # the most, chunked
@example(in_features=576, out_features=100, bias=True, rows=4, seed=1)  # the most rows in the straight loop
@example(in_features=1100, out_features=960, bias=True, rows=1, seed=2)  # one row, two blocks at once
@example(in_features=576, out_features=960, bias=True, rows=3, seed=4)  # 2-4 rows, two blocks at once
def test_the_avx2_code_gives_onednns_bits_at_every_row_count(in_features, out_features, bias, rows, seed):
    """packed_gemv.c built without AVX-512, as an AVX2 CPU builds it: up to 4 rows two whole blocks
    at a time (one row by its own loop), the straight loop for a block's part, more rows in register
    tiles, a share of a block's outputs to each thread; some chunk gives oneDNN's bits, as
    FewRowsLinear's first call finds it, at every row count up to MAX_ROWS."""
    gemv = packed_gemv_library(packed_linear.SOURCE, AVX2_ONLY).packed_gemv
    linear = packed_linear_of(in_features, out_features, bias, seed)
    shape = kernel_shape(linear)
    assert shape is not None
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(seed + 1))
    address = torch.ops.mkldnn.data_ptr(linear.weight)
    sizes = [(in_features, shape.in_padded, out_features, chunk) for chunk in CHUNKS]
    with torch.inference_mode(), torch_threads(1 if splits_among_threads(linear, x) else torch.get_num_threads()):
        expected = linear(x)  # in parts among its threads, oneDNN's sum is in no order: one thread
        results = [run_kernel(gemv, x, address, linear.bias, shape, size) for size in sizes]
    assert any(torch.equal(result, expected) for result in results)


def test_a_kernel_that_disagrees_is_never_used(monkeypatch):
    """A planted bug: the chunk tried is wrong for 1536 inputs (oneDNN sums 512 or 1024 at a time,
    by CPU and row count). The first call gives oneDNN's result, and every later one too."""
    monkeypatch.setattr(packed_linear, "CHUNKS", (256,))
    linear = packed_linear_of(1536, 128, False, 0)
    matmul = kernel_first(linear)
    x, zeros = torch.randn(2, 1536), torch.zeros(2, 1536)
    with torch.inference_mode():
        assert torch.equal(matmul.kernel(zeros, 256), linear(zeros))  # rows of zeros cannot tell
        assert torch.equal(matmul(zeros), linear(zeros))  # the first call compares on random rows
        expected = linear(x)
        assert not torch.equal(matmul.kernel(x, 256), expected)
        assert torch.equal(matmul(x), expected)
    assert matmul.agreement.rows == {2: 0}


def test_a_wrong_layout_is_caught_by_the_first_call():
    """A planted bug: the padded row of inputs one 16 too long, so every block is read askew."""
    linear = packed_linear_of(100, 128, True, 0)
    right = kernel_first(linear)
    in_features, in_padded, out_features, bias, dtype = right.shape
    askew = FewRowsLinear(
        right.forward,
        right.weight,
        right.address,
        right.bias,
        Shape(in_features, in_padded + 16, out_features, bias, dtype),
        Agreement(),
    )
    x = torch.randn(1, 100)
    with torch.inference_mode():
        assert torch.equal(askew(x), linear(x))
        assert askew.agreement.rows == {1: 0}
        assert torch.equal(askew(x), linear(x))


def test_linears_of_one_shape_share_what_the_first_showed():
    agreements: dict = {}
    first, second = (few_rows_first(packed_linear_of(64, 64, False, seed), agreements) for seed in (0, 1))
    assert isinstance(first, FewRowsLinear) and isinstance(second, FewRowsLinear)
    with torch.inference_mode():
        first(torch.randn(3, 64))
    assert second.agreement.rows[3] and len(agreements) == 1


def test_agree_all_checks_each_shape_at_every_row_count_so_no_step_checks_later(monkeypatch):
    """What the bench's warm-up runs: every row count of each shape checked once, up front; then a
    call at any of them runs the kernel with no check, and a second agree_all checks nothing."""
    agreements: dict = {}
    linears = [packed_linear_of(64, 64, False, seed) for seed in (0, 1)] + [packed_linear_of(64, 100, True, 2)]
    matmuls = [few_rows_first(linear, agreements) for linear in linears] + [Linear(8, 8).forward]
    assert agree_all(matmuls) == 2 * MAX_ROWS  # two shapes; the plain forward has no kernel
    assert all(sorted(a.rows) == list(range(1, MAX_ROWS + 1)) for a in agreements.values())
    assert agree_all(matmuls) == 0

    def no_more_checks(self, rows):
        raise AssertionError(f"a check at {rows} rows after agree_all")

    monkeypatch.setattr(FewRowsLinear, "agreeing_chunk", no_more_checks)
    x = torch.randn(MAX_ROWS, 64)
    with torch.inference_mode():
        for matmul, linear in zip(matmuls, linears):
            assert torch.equal(matmul(x), linear(x))


def test_more_rows_go_to_onednn_unchecked():
    linear = packed_linear_of(64, 64, False, 0)
    matmul = kernel_first(linear)
    x = torch.randn(MAX_ROWS + 1, 64)
    with torch.inference_mode():
        assert torch.equal(matmul(x), linear(x))
    assert matmul.agreement.rows == {}


def test_weights_no_kernel_takes_keep_the_linears_forward():
    plain = Linear(64, 64)
    assert few_rows_first(plain, {}) == plain.forward
    bf16 = Linear(64, 64).to(torch.bfloat16)
    pack_for_onednn(bf16)  # packed only where oneDNN has bf16 kernels
    assert isinstance(few_rows_first(bf16, {}), FewRowsLinear) == bf16_kernel_ready()
    odd = Linear(47, 64).to(torch.bfloat16)  # AMX multiplies 32 inputs at a time, VDPBF16PS 2
    pack_for_onednn(odd)
    assert few_rows_first(odd, {}) == odd.forward
    half = Linear(64, 64).to(torch.float16)
    assert few_rows_first(half, {}) == half.forward


needs_amx = pytest.mark.skipif(not amx_ready(), reason="the bfloat16 kernel runs on CPUs with AMX")


needs_bf16_kernel = pytest.mark.skipif(
    not bf16_kernel_ready(), reason="the bfloat16 kernels run on CPUs with AMX or AVX512_BF16"
)


@needs_bf16_kernel
@settings(max_examples=30, deadline=None)
@given(
    in_features=st.sampled_from([64, 576, 1536]),
    out_features=st.sampled_from([8, 100, 960]),
    bias=st.booleans(),
    rows=st.integers(1, DPBF16_MAX_ROWS),
    seed=st.integers(0, 99),
)
@example(in_features=1536, out_features=100, bias=True, rows=1, seed=5)  # one row: its own loop
def test_bfloat16_rows_get_onednns_bits_from_the_kernel(in_features, out_features, bias, rows, seed):
    """Outputs past a block (AMX's 32, VDPBF16PS's 64), rows past a tile (16, 7), inputs in chunks
    (VDPBF16PS), and the probe's sums that cancel. (oneDNN sums otherwise in a few shapes, 32 inputs
    at one row on a Sapphire Rapids: there the check keeps oneDNN,
    test_a_kernel_that_disagrees_is_never_used.)"""
    linear = packed_linear_of(in_features, out_features, bias, seed, torch.bfloat16)
    matmul = kernel_first(linear)
    rows = min(rows, matmul.max_rows)  # AMX's 32, VDPBF16PS's 64
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(seed + 1)).bfloat16()
    with torch.inference_mode():
        expected = linear(x)
        assert torch.equal(matmul(x), expected)
        chunk = matmul.agreement.rows[rows]
        assert chunk == packed_linear.K_STEP if amx_ready() else chunk in CHUNKS
        assert torch.equal(matmul.kernel(x, chunk), expected)
        probe = matmul.agreement.probe
        assert probe is not None
        rows_of_probe = cancelling_rows(matmul.shape, rows)
        address = torch.ops.mkldnn.data_ptr(probe.weight)
        assert torch.equal(
            packed_linear.run_bf16(rows_of_probe, address, probe.bias, matmul.shape, chunk), probe(rows_of_probe)
        )


def summed_backwards(run_bf16, block: int, group: int):
    """A planted bug: the kernel on the same products, its groups of `group` inputs summed last to
    first (each block of `block` outputs of the packed weight and each row reversed group by group):
    AMX's groups of 32, VDPBF16PS's pairs."""

    def run(x, address, bias, shape, chunk):
        in_features, _, out_features, _, _ = shape
        blocks, steps = -(-out_features // block), in_features // group
        numbers = (ctypes.c_int16 * (blocks * block * in_features)).from_address(address)
        weight = torch.frombuffer(numbers, dtype=torch.int16).view(blocks, steps, block * group).flip(1).contiguous()
        rows = x.reshape(len(x), steps, group).flip(1).contiguous()
        return run_bf16(rows, weight.data_ptr(), bias, shape, chunk)

    return run


@needs_bf16_kernel
def test_bfloat16_summed_in_another_order_is_caught_by_the_probe(monkeypatch):
    """Random rows hardly show the order of a bfloat16 linear's sums; the probe's cancelling sums do.
    Without the plant the same call agrees (test_bfloat16_rows_get_onednns_bits_from_the_kernel)."""
    linear = packed_linear_of(576, 960, True, 0, torch.bfloat16)
    matmul = kernel_first(linear)
    block, group = (32, 32) if amx_ready() else (64, 2)  # AMX's groups of inputs, VDPBF16PS's pairs
    monkeypatch.setattr(packed_linear, "run_bf16", summed_backwards(packed_linear.run_bf16, block, group))
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(1)).bfloat16()
    with torch.inference_mode():
        expected = linear(x)
        wrong = matmul.kernel(x, 512)
        assert (wrong == expected).float().mean() > 0.95  # the plant barely shows on random rows
        assert torch.equal(matmul(x), expected)  # yet the first call, probe included, catches it
    assert matmul.agreement.rows == {4: 0}


@needs_amx
def test_onednns_own_tiles_are_untouched_by_the_kernel():
    """Both configure AMX's tiles on the same threads: oneDNN's next result must not change."""
    linear = packed_linear_of(576, 960, False, 0, torch.bfloat16)
    matmul = kernel_first(linear)
    x = torch.randn(32, 576).bfloat16()
    with torch.inference_mode():
        expected = linear(x)
        for rows in (1, 3, 17, 32):
            matmul(x[:rows])
            assert torch.equal(linear(x), expected)
