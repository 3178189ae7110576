"""The three fused steps of fused_ops.c, called on torch tensors (see that file for what each
computes and how it rounds). Shapes are checked by the caller, FusedDecoder: these run once per
layer per step, so they only pass pointers."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from tracer.kernels.build import load

SOURCE = Path(__file__).with_name("fused_ops.c")
I64, PTR, INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


@functools.cache
def fused_ops_library(source: Path = SOURCE) -> ctypes.CDLL:
    library = load(source)
    library.add_rms_norm.argtypes = [PTR] * 4 + [I64, I64, ctypes.c_float, INT, INT]
    library.rope_write_kv.argtypes = [PTR] * 8 + [I64] * 5 + [INT, INT, INT]
    library.silu_and_mul.argtypes = [PTR, PTR, I64, I64, I64, INT, INT]
    library.add_rms_norm.restype = INT
    library.rope_write_kv.restype = library.silu_and_mul.restype = None
    return library


def add_rms_norm(x: Tensor | None, residual: Tensor, weight: Tensor, eps: float) -> Tensor:
    """residual += x (in place, when x is given); returns RMSNorm(residual) * weight."""
    out = torch.empty_like(residual)
    rows, dim = residual.shape
    failed = fused_ops_library().add_rms_norm(
        None if x is None else x.data_ptr(),
        residual.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        rows,
        dim,
        eps,
        int(residual.dtype == torch.bfloat16),
        torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("add_rms_norm could not allocate a row of scratch")
    return out


def rope_write_kv(
    qkv: Tensor,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    slot_mapping: Tensor,
    kv: Tensor,
    heads: int,
) -> Tensor:
    """q rotated, [tokens, heads, dim]; k rotated and v written into kv [2, blocks, kv_heads,
    block_size, dim] at their slots (kv in qkv's dtype, or bfloat16 under float32: cache_fits)."""
    if not cache_fits(qkv.dtype, kv.dtype):
        raise ValueError(f"rope_write_kv: a {kv.dtype} KV cache under {qkv.dtype} activations")
    _, _, kv_heads, block_size, dim = kv.shape
    q = qkv.new_empty(qkv.shape[0], heads, dim)
    fused_ops_library().rope_write_kv(
        qkv.data_ptr(),
        positions.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        slot_mapping.data_ptr(),
        kv.data_ptr(),  # K
        kv.data_ptr() + kv.stride(0) * kv.element_size(),  # V
        q.data_ptr(),
        qkv.shape[0],
        heads,
        kv_heads,
        dim,
        block_size,
        int(qkv.dtype == torch.bfloat16),
        int(kv.dtype == torch.bfloat16),
        torch.get_num_threads(),
    )
    return q


def cache_fits(dtype: torch.dtype, kv_dtype: torch.dtype) -> bool:
    """The kernels take a KV cache in the activations' dtype, or bfloat16 under float32 ones (the
    engine's kv_cache_dtype="bfloat16": each K/V rounded once as it is written, read widened)."""
    return kv_dtype == dtype or (dtype == torch.float32 and kv_dtype == torch.bfloat16)


@functools.cache
def silu_vector_run() -> int:
    """How many elements torch's vectorized silu takes at once here (two vectors of floats); the
    rest of a row goes through the C library's exp. 0 where torch has no x86 vector kernels."""
    return {"AVX512": 32, "AVX2": 16}.get(torch.backends.cpu.get_cpu_capability(), 0)


def silu_and_mul(gate_up: Tensor) -> Tensor:
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(rows, width)
    is_bf16 = int(gate_up.dtype == torch.bfloat16)
    threads = torch.get_num_threads()
    fused_ops_library().silu_and_mul(
        gate_up.data_ptr(), out.data_ptr(), rows, width, silu_vector_run(), is_bf16, threads
    )
    return out
