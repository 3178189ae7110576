"""A linear layer that sends a few rows through packed_gemv.c and more through oneDNN: the same
packed weight, the same bits (see that file for the layout and the order of the sums).

The kernel is trusted with a row count only once it has given oneDNN's bits: the first call of
each shape of linear with that many rows runs both on random rows and compares (and finds the
chunks in which oneDNN sums its inputs). oneDNN picks its layout and kernel by shape, dtype and
CPU, not by the values, so one linear of each shape answers for all of them. Where the bits
differ, that shape keeps oneDNN."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from nanoengine.model import Linear
from tracer.kernels.build import load

SOURCE = Path(__file__).with_name("packed_gemv.c")
I64, PTR, INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
MatMul = Callable[[Tensor], Tensor]

BLOCK = 64  # outputs per block of the packed layout (packed_gemv.c)
# Up to this many rows the kernel makes a decode step shorter (docs/benchmarks.md, thirteenth round:
# one engine switching at every step, 0.68x at 1 row, 0.78x at 4, 0.89x at 8, 1.05x at 12).
MAX_ROWS = 8
# How many inputs oneDNN sums before starting a new partial sum: 1024 on the CPUs measured; the
# others are tried where that gives other bits.
CHUNKS = (1024, 512, 256, 2048, 4096)


@functools.cache
def packed_gemv_library() -> ctypes.CDLL:
    library = load(SOURCE)
    library.packed_gemv.argtypes = [PTR] * 4 + [I64] * 5 + [INT]
    library.packed_gemv.restype = None
    return library


Shape = tuple[int, int, int, bool]  # in_features, in_padded, out_features, has a bias


@dataclass(slots=True)
class Agreement:
    """What one shape of linear has shown: for each row count, whether the kernel gave oneDNN's
    bits, and with which chunk."""

    chunk: int = 0  # 0 until found
    rows: dict[int, bool] = field(default_factory=dict)

    def check(self, kernel: Callable[[int], Tensor], expected: Tensor) -> bool:
        chunks = (self.chunk,) if self.chunk else CHUNKS
        found = next((chunk for chunk in chunks if torch.equal(kernel(chunk), expected)), 0)
        self.chunk = self.chunk or found
        return found != 0


@dataclass(slots=True, frozen=True)
class FewRowsLinear:
    """Called like the linear's forward: up to MAX_ROWS rows through the kernel, once it agrees."""

    forward: MatMul  # oneDNN
    weight: Tensor  # packed; held so that its address stays valid
    address: int  # of the weight's packed floats
    bias: Tensor | None
    shape: Shape
    agreement: Agreement  # shared by the linears of this shape

    def __call__(self, x: Tensor) -> Tensor:
        rows = x.shape[0]
        if rows > MAX_ROWS or x.dtype != torch.float32 or not x.is_contiguous():
            return self.forward(x)
        agreed = self.agreement.rows.get(rows)
        if agreed is None:
            agreed = self.agreement.rows[rows] = self.agrees(rows)
        return self.kernel(x, self.agreement.chunk) if agreed else self.forward(x)

    def agrees(self, rows: int) -> bool:
        """Whether the kernel gives oneDNN's bits on random rows (which no chunk of the wrong size
        sums to the same bits, as rows of zeros would)."""
        x = torch.randn(rows, self.shape[0], generator=torch.Generator().manual_seed(rows))
        return self.agreement.check(lambda chunk: self.kernel(x, chunk), self.forward(x))

    def kernel(self, x: Tensor, chunk: int) -> Tensor:
        in_features, in_padded, out_features, _ = self.shape
        y = x.new_empty(x.shape[0], out_features)
        packed_gemv_library().packed_gemv(
            x.data_ptr(),
            self.address,
            None if self.bias is None else self.bias.data_ptr(),
            y.data_ptr(),
            x.shape[0],
            in_features,
            in_padded,
            out_features,
            chunk,
            torch.get_num_threads(),
        )
        return y


def packed_float32(linear: Linear) -> bool:
    weight, bias = linear.weight, linear.bias
    return (
        weight.is_mkldnn
        and weight.dtype == torch.float32
        and hasattr(torch.ops.mkldnn, "data_ptr")
        and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
    )


def in_padded(linear: Linear) -> int | None:
    """The packed layout's inputs per output, padding included (so that the kernel reads exactly the
    packed bytes); None if their number says another layout."""
    blocks = -(-linear.out_features // BLOCK)
    floats, rest = divmod(torch.ops.mkldnn._nbytes(linear.weight), 4 * blocks * BLOCK)
    return floats if rest == 0 and floats >= linear.in_features else None


def few_rows_first(linear: Linear, agreements: dict[Shape, Agreement]) -> MatMul:
    """A FewRowsLinear for a float32 linear packed for oneDNN, else the linear's forward."""
    padded = in_padded(linear) if packed_float32(linear) else None
    if padded is None:
        return linear.forward
    shape = (linear.in_features, padded, linear.out_features, linear.bias is not None)
    agreement = agreements.setdefault(shape, Agreement())
    address = torch.ops.mkldnn.data_ptr(linear.weight)
    return FewRowsLinear(linear.forward, linear.weight, address, linear.bias, shape, agreement)
