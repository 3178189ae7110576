"""TorchAttention with decode done by a compiled kernel that reads the pages in place.

The engine's torch backend gathers each decode group's pages into a padded copy, then reads that
copy twice (scores, then values): three passes over the K/V a step attends to. paged_decode.c reads
each sequence's blocks where they lie, once. Same cache layout, same prefill path (torch's SDPA):
a drop-in `attention_backend` for LLMEngine on the CPU, in float32 and bfloat16."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from nanoengine.attention import AttentionMetadata, KVCache, TorchAttention
from tracer.kernels.build import FLAGS, load
from tracer.kernels.fused_ops import cache_fits

SOURCE = Path(__file__).with_name("paged_decode.c")
DTYPES = (torch.float32, torch.bfloat16)
I64, PTR = ctypes.c_int64, ctypes.c_void_p


@functools.cache
def paged_decode_library(source: Path = SOURCE, flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL:
    library = load(source, flags)
    library.paged_decode.restype = ctypes.c_int
    library.paged_decode.argtypes = [PTR] * 6 + [I64] * 7 + [ctypes.c_float] + [ctypes.c_int] * 4
    return library


def paged_decode(
    q: Tensor, kv: KVCache, block_tables: Tensor, seq_lens: Tensor, scale: float, plain: bool = False
) -> Tensor:
    """q [num_seqs, heads, dim], one query token per sequence at its last position -> [num_seqs,
    heads, dim]. kv: one layer's [2, num_blocks, kv_heads, block_size, dim] cache, in q's dtype or
    bfloat16 under float32 (cache_fits). plain: without the kernel's AVX-512 or AVX2 copy of its
    loops (the same bits; what the tests hold that copy to)."""
    if q.dtype not in DTYPES or not cache_fits(q.dtype, kv.dtype) or q.device.type != "cpu":
        raise ValueError(
            f"paged_decode runs float32 or bfloat16 on the CPU (a bfloat16 cache under float32 too), "
            f"got {q.dtype} with a {kv.dtype} cache on {q.device}"
        )
    if not kv.is_contiguous():
        raise ValueError("paged_decode needs a contiguous KV cache")
    q, tables, lens = q.contiguous(), block_tables.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous()
    _, num_blocks, kv_heads, block_size, dim = kv.shape
    num_seqs, heads, q_dim = q.shape
    if q_dim != dim or heads % kv_heads or tables.shape[0] != num_seqs or lens.shape != (num_seqs,):
        raise ValueError(
            f"paged_decode: q {tuple(q.shape)}, cache {tuple(kv.shape)}, tables {tuple(tables.shape)} and "
            f"seq_lens {tuple(lens.shape)} do not fit: one row and one length per sequence, same head dim"
        )
    out = torch.empty_like(q)
    k_cache = kv.data_ptr()  # kv[0] and kv[1] by address: two views cost more than the arithmetic
    status = paged_decode_library().paged_decode(
        q.data_ptr(),
        k_cache,
        k_cache + kv.stride(0) * kv.element_size(),
        out.data_ptr(),
        tables.data_ptr(),
        lens.data_ptr(),
        q.shape[0],
        q.shape[1],
        kv_heads,
        dim,
        num_blocks,
        block_size,
        tables.shape[1],
        scale,
        int(q.dtype == torch.bfloat16),
        int(kv.dtype == torch.bfloat16),
        torch.get_num_threads(),
        int(not plain),
    )
    if status & 2:
        raise IndexError("paged_decode: a block table points outside the KV pool or is shorter than its sequence")
    if status & 1:
        raise MemoryError("paged_decode could not allocate its score buffers")
    return out


class PagedDecodeAttention(TorchAttention):
    """Decode rows (one query token) through the compiled kernel; prefill chunks as TorchAttention,
    and every row where the kernel does not take the cache's dtype (cache_fits)."""

    def __init__(self) -> None:
        paged_decode_library()  # build (or load) now: a machine without a compiler fails here, once
        self.step_meta: AttentionMetadata | None = None
        self.decodes: tuple[Tensor, Tensor, Tensor] | None = None

    def __call__(self, q: Tensor, kv: KVCache, meta: AttentionMetadata, scale: float) -> Tensor:
        if not meta.decodes or q.dtype not in DTYPES or not cache_fits(q.dtype, kv.dtype):
            return super().__call__(q, kv, meta, scale)
        rows, tables, lens = self.decode_rows(meta)
        if not meta.prefills:  # every row a decode: no torch pass at all
            return paged_decode(q, kv, tables, lens, scale)
        out = super().__call__(q, kv, replace(meta, decodes=[], decode_groups=[]), scale)  # prefills only
        out[rows] = paged_decode(q[rows], kv, tables, lens, scale)
        return out

    def decode_rows(self, meta: AttentionMetadata) -> tuple[Tensor, Tensor, Tensor]:
        """The decode sequences' rows, block tables and lengths, from the runner's list of the
        step's decodes: gathered once a step (the metadata is built once a step and passed to every
        layer)."""
        if meta is not self.step_meta or self.decodes is None:
            seqs, rows, _ = map(list, zip(*meta.decodes))  # (batch index, row, seq_len) each
            decodes = torch.tensor(rows), meta.block_tables[seqs], meta.seq_lens[seqs]
            self.step_meta, self.decodes = meta, decodes
        return self.decodes
