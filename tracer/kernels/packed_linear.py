"""A linear layer that sends a few rows through a kernel reading oneDNN's packed weight in place,
and more through oneDNN: packed_gemv.c in float32; in bfloat16 amx_gemv.c on CPUs with AMX, and
dpbf16_gemv.c on CPUs with AVX512_BF16 but no AMX. The same packed weight, the same bits (see those
files for the layouts and the order of the sums).

The kernel is trusted with a row count only once it has given oneDNN's bits: the first call of
each shape of linear with that many rows runs both and compares (in float32 on random rows, which
also finds the chunk in which oneDNN sums its inputs; in bfloat16 on rows whose sums cancel, see
cancelling_probe). oneDNN picks its layout and kernel by shape, dtype and CPU, not by the values,
so one linear of each shape answers for all of them. Where the bits differ, that shape keeps
oneDNN."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from nanoengine.loading.build import pack_for_onednn
from nanoengine.model import Linear
from tracer.kernels.build import FLAGS, KernelUnavailable, has_avx2, load

SOURCE = Path(__file__).with_name("packed_gemv.c")
AMX_SOURCE = Path(__file__).with_name("amx_gemv.c")
DPBF16_SOURCE = Path(__file__).with_name("dpbf16_gemv.c")
I64, PTR, INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
MatMul = Callable[[Tensor], Tensor]

BLOCK = 64  # outputs per block of the packed float32 layout (packed_gemv.c)
# Up to this many rows the kernel takes a linear (docs/benchmarks.md): with AVX-512 it is faster than
# oneDNN (the fifteenth round: the model's linears 0.81x at 1 row, 0.76x at 16, 0.84x at 32, 0.91x at
# 64); with AVX2 alone 0.64-0.79x at 1-64 rows (thirty-fifth round, a Zen 3 host), and it lets the
# one-call decode step (decode_layers.py) take every step up to 64 rows. Without AVX2 and FMA the
# kernel has only its straight loop (1.22x at 16 rows).
MAX_ROWS = 64 if has_avx2() else 8
# How many inputs oneDNN sums before starting a new partial sum: 1024 or 512 on the CPUs measured
# (by row count); the others are tried where those give other bits.
CHUNKS = (1024, 512, 256, 2048, 4096)
CHECKED_OUTPUTS = 512  # at least this many outputs compared before a row count is trusted
# bfloat16 (amx_gemv.c): oneDNN's bits up to 32 rows, in 0.79-0.85x its time; past 32 rows oneDNN
# sums otherwise (docs/benchmarks.md, fourteenth round). dpbf16_gemv.c: oneDNN's bits up to 64 rows
# at least, in 0.79-0.92x its time at 1-32 rows and about its time at 33-64 (where the one-call
# decode step it allows saves the layer loop's Python) on a Zen 5 (twenty-third round).
AMX_MAX_ROWS = 32
DPBF16_MAX_ROWS = 64
AMX_BLOCK = 32  # outputs per block of the packed bfloat16 layout (amx_gemv.c)
DPBF16_BLOCK = 64  # the same without AMX (dpbf16_gemv.c)
K_STEP = 32  # inputs per AMX multiply: `in` must be a multiple


@functools.cache
def packed_gemv_library(source: Path = SOURCE, flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL:
    library = load(source, flags)
    library.packed_gemv.argtypes = [PTR] * 4 + [I64] * 5 + [INT]
    library.packed_gemv.restype = None
    return library


def bf16_gemv_library(source: Path, sizes: int) -> ctypes.CDLL:
    """A bfloat16 kernel's library, called as (x, W, b, y, *sizes, threads). It builds everywhere;
    where the CPU or the compiler lacks its instructions, its `<name>_ready` says no."""
    library = load(source)
    gemv, ready = getattr(library, source.stem), getattr(library, f"{source.stem}_ready")
    gemv.argtypes, gemv.restype, ready.restype = [PTR] * 4 + [I64] * sizes + [INT], None, INT
    return library


@functools.cache
def amx_gemv_library(source: Path = AMX_SOURCE) -> ctypes.CDLL:
    return bf16_gemv_library(source, 3)  # rows, in, out


@functools.cache
def dpbf16_gemv_library(source: Path = DPBF16_SOURCE) -> ctypes.CDLL:
    return bf16_gemv_library(source, 4)  # rows, in, out, chunk


def kernel_says_ready(library: Callable[[], ctypes.CDLL], ready: str) -> bool:
    """The kernel's own `ready` function's answer; False where the kernel cannot be built."""
    try:
        return bool(getattr(library(), ready)())
    except KernelUnavailable:
        return False


@functools.cache
def dpbf16_ready() -> bool:
    """Whether this CPU and compiler have AVX512_BF16's VDPBF16PS (used where AMX is not ready)."""
    return kernel_says_ready(dpbf16_gemv_library, "dpbf16_gemv_ready")


@functools.cache
def amx_ready() -> bool:
    """Whether this CPU and compiler have AMX's bf16 tiles, and Linux lets this process use them."""
    return kernel_says_ready(amx_gemv_library, "amx_gemv_ready")


def bf16_kernel_ready() -> bool:
    """Whether a bfloat16 few-row kernel runs here: AMX's, or else VDPBF16PS's."""
    return amx_ready() or dpbf16_ready()


class Shape(NamedTuple):
    """What a kernel needs to know of a linear, and what linears that share an Agreement share."""

    in_features: int
    in_padded: int  # inputs per output in the packed layout, padding included
    out_features: int
    bias: bool
    dtype: torch.dtype


@dataclass(slots=True)
class Agreement:
    """What one shape of linear has shown: for each row count, the chunk with which the kernel gave
    oneDNN's bits (K_STEP in bfloat16 on AMX, the groups it sums), 0 where it did not. oneDNN may sum in
    other chunks at other row counts (512 at one row and 1024 at four, on a Xeon with AVX-512)."""

    rows: dict[int, int] = field(default_factory=dict)
    probe: Linear | None = None  # bfloat16: cancelling_probe's linear, while row counts are left


def cancelling_probe(shape: Shape) -> Linear:
    """A linear of this shape whose every output, on cancelling_rows, is a sum that cancels: a large
    first and last term around small ones, so that its bits show the order in which the sum was
    added up (the small terms' rounding against the large one is all that is left). Its weights
    are random, a block of 32 outputs repeated (cheap to make for an LM head)."""
    in_features, _, out_features, bias, dtype = shape
    gen = torch.Generator().manual_seed(0)
    probe = Linear(in_features, out_features, bias=bias, dtype=dtype)
    block = torch.randn(AMX_BLOCK, in_features, generator=gen)
    block[:, 0], block[:, -1] = 2.0**12, -(2.0**12)
    probe.weight.data = block.to(dtype).repeat(-(-out_features // AMX_BLOCK), 1)[:out_features].contiguous()
    if bias:
        probe.bias.data = torch.randn(out_features, generator=gen).to(dtype)
    pack_for_onednn(probe)
    return probe


def cancelling_rows(shape: Shape, rows: int) -> Tensor:
    x = torch.randn(rows, shape.in_features, generator=torch.Generator().manual_seed(rows))
    x[:, 0] = x[:, -1] = 2.0**8
    return x.to(shape.dtype)


@dataclass(slots=True, frozen=True)
class FewRowsLinear:
    """Called like the linear's forward: up to max_rows rows through the kernel, once it agrees."""

    forward: MatMul  # oneDNN
    weight: Tensor  # packed; held so that its address stays valid
    address: int  # of the weight's packed numbers
    bias: Tensor | None
    shape: Shape
    agreement: Agreement  # shared by the linears of this shape

    @property
    def max_rows(self) -> int:
        if self.shape.dtype == torch.bfloat16:
            return AMX_MAX_ROWS if amx_ready() else DPBF16_MAX_ROWS
        return MAX_ROWS

    def __call__(self, x: Tensor) -> Tensor:
        rows = x.shape[0]
        if rows > self.max_rows or x.dtype != self.shape.dtype or not x.is_contiguous():
            return self.forward(x)
        chunk = self.agree(rows)
        return self.kernel(x, chunk) if chunk else self.forward(x)

    def agree(self, rows: int) -> int:
        """The chunk agreed on at this many rows (0: none agrees), checked at its first asking."""
        chunk = self.agreement.rows.get(rows)
        if chunk is None:
            chunk = self.agreement.rows[rows] = self.agreeing_chunk(rows)
        return chunk

    def agreeing_chunk(self, rows: int) -> int:
        """The chunk with which the kernel gives oneDNN's bits, 0 if none does. float32: on random
        rows, enough for CHECKED_OUTPUTS outputs (a chunk of the wrong size cannot sum them all to
        the same bits, as rows of zeros would). bfloat16: on cancelling_probe (random rows cannot
        show the order of the sums through bfloat16's rounding)."""
        if self.shape.dtype == torch.bfloat16:
            probe = self.agreement.probe = self.agreement.probe or cancelling_probe(self.shape)
            if len(self.agreement.rows) + 1 == self.max_rows:  # the last row count: let it go
                self.agreement.probe = None
            return bf16_agreeing_chunk(probe, self.shape, rows)
        gen = torch.Generator().manual_seed(rows)
        calls = -(-CHECKED_OUTPUTS // (rows * self.shape.out_features))
        xs = [torch.randn(rows, self.shape.in_features, generator=gen) for _ in range(calls)]
        expected = [self.forward(x) for x in xs]
        agrees = (c for c in CHUNKS if all(torch.equal(self.kernel(x, c), y) for x, y in zip(xs, expected)))
        return next(agrees, 0)

    def kernel(self, x: Tensor, chunk: int) -> Tensor:
        if self.shape.dtype == torch.bfloat16:
            return run_bf16(x, self.address, self.bias, self.shape, chunk)
        return run_packed_gemv(x, self.address, self.bias, self.shape, chunk)


def bf16_agreeing_chunk(probe: Linear, shape: Shape, rows: int) -> int:
    """The chunk with which the bfloat16 kernel gives oneDNN's bits on the probe, 0 if none does: on
    AMX K_STEP (its instruction's own groups) or nothing, on cancelling rows; with VDPBF16PS the
    first of CHUNKS that agrees on cancelling rows and on random ones, as float32 is checked."""
    address = torch.ops.mkldnn.data_ptr(probe.weight)
    xs = [cancelling_rows(shape, rows)]
    if not amx_ready():
        generator = torch.Generator().manual_seed(rows)
        xs.append(torch.randn(rows, shape.in_features, generator=generator).to(shape.dtype))
    expected = [probe(x) for x in xs]
    chunks = (K_STEP,) if amx_ready() else CHUNKS
    agrees = (
        c
        for c in chunks
        if all(torch.equal(run_bf16(x, address, probe.bias, shape, c), y) for x, y in zip(xs, expected))
    )
    return next(agrees, 0)


def run_packed_gemv(x: Tensor, address: int, bias: Tensor | None, shape: Shape, chunk: int) -> Tensor:
    sizes = (shape.in_features, shape.in_padded, shape.out_features, chunk)
    return run_kernel(packed_gemv_library().packed_gemv, x, address, bias, shape, sizes)


def agree_all(linears: Iterable[MatMul]) -> int:
    """Run the first-use check of each shape of linear at every row count its kernel takes, now
    rather than inside the steps that first meet those counts: what vLLM does when it captures a
    CUDA graph for each batch size before serving, so that a timed run measures steps, not checks.
    Returns how many checks ran (none where each was done already)."""
    kernels = {linear.shape: linear for linear in linears if isinstance(linear, FewRowsLinear)}
    checks = 0
    with torch.inference_mode():
        for linear in kernels.values():
            unchecked = [rows for rows in range(1, linear.max_rows + 1) if rows not in linear.agreement.rows]
            for rows in unchecked:
                linear.agree(rows)
            checks += len(unchecked)
    return checks


def run_bf16(x: Tensor, address: int, bias: Tensor | None, shape: Shape, chunk: int) -> Tensor:
    """amx_gemv where AMX is ready, else dpbf16_gemv (summing in chunks of `chunk` inputs)."""
    if amx_ready():
        return run_kernel(amx_gemv_library().amx_gemv, x, address, bias, shape, (shape.in_features, shape.out_features))
    sizes = (shape.in_features, shape.out_features, chunk)
    return run_kernel(dpbf16_gemv_library().dpbf16_gemv, x, address, bias, shape, sizes)


def run_kernel(gemv: Callable, x: Tensor, address: int, bias: Tensor | None, shape: Shape, sizes: tuple) -> Tensor:
    """y = x W + b through a kernel called as (x, W, b, y, rows, *sizes, threads)."""
    y = x.new_empty(x.shape[0], shape.out_features)
    b = None if bias is None else bias.data_ptr()
    gemv(x.data_ptr(), address, b, y.data_ptr(), x.shape[0], *sizes, torch.get_num_threads())
    return y


def packed_as(linear: Linear, dtype: torch.dtype) -> bool:
    weight, bias = linear.weight, linear.bias
    return (
        weight.is_mkldnn
        and weight.dtype == dtype
        and hasattr(torch.ops.mkldnn, "data_ptr")
        and (bias is None or (bias.dtype == dtype and bias.is_contiguous()))
    )


def in_padded(linear: Linear, block: int, size: int) -> int | None:
    """The packed layout's inputs per output, padding included (so that the kernel reads exactly the
    packed bytes); None if their number says another layout."""
    blocks = -(-linear.out_features // block)
    numbers, rest = divmod(torch.ops.mkldnn._nbytes(linear.weight), size * blocks * block)
    return numbers if rest == 0 and numbers >= linear.in_features else None


def kernel_shape(linear: Linear) -> Shape | None:
    """The shape a kernel takes this linear in, or None: float32 packed for oneDNN, or bfloat16
    packed where AMX runs (its inputs a multiple of K_STEP) or VDPBF16PS does (an even number of
    them), unpadded."""
    in_features, out_features, bias = linear.in_features, linear.out_features, linear.bias is not None
    if packed_as(linear, torch.float32):
        padded = in_padded(linear, BLOCK, 4)
        return None if padded is None else Shape(in_features, padded, out_features, bias, torch.float32)
    if packed_as(linear, torch.bfloat16) and in_features % K_STEP == 0 and amx_ready():
        padded = in_padded(linear, AMX_BLOCK, 2)
        return Shape(in_features, padded, out_features, bias, torch.bfloat16) if padded == in_features else None
    if packed_as(linear, torch.bfloat16) and in_features % 2 == 0 and not amx_ready() and dpbf16_ready():
        padded = in_padded(linear, DPBF16_BLOCK, 2)
        return Shape(in_features, padded, out_features, bias, torch.bfloat16) if padded == in_features else None
    return None


def few_rows_first(linear: Linear, agreements: dict[Shape, Agreement]) -> MatMul:
    """A FewRowsLinear for a linear that a kernel takes (kernel_shape), else the linear's forward."""
    shape = kernel_shape(linear)
    if shape is None:
        return linear.forward
    agreement = agreements.setdefault(shape, Agreement())
    address = torch.ops.mkldnn.data_ptr(linear.weight)
    return FewRowsLinear(linear.forward, linear.weight, address, linear.bias, shape, agreement)
