"""How fast this machine reads a KV pool's pages the way decode attention reads them, with nothing
computed (paged_decode.c: read_pages): the rate that bounds a decode step's attention, which the
bench's limit on decode's reach charges the phase's K/V at.

A plain sequential read is not that rate: a step's K/V lie in pages of a few kB scattered over the
pool, each a new address translation and a run too short for the hardware's prefetchers, and the
kernel asks for them a block ahead. On the Zen 3 of docs/benchmarks.md (thirty-ninth round) such
reads alone came at ~24 GB/s where torch's sum of one buffer read ~32-43."""

from __future__ import annotations

import ctypes
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tracer.bench.model_shape import ModelShape
from tracer.bench.roofline import ByteModel
from tracer.bench.timing import other_reads, time_call
from tracer.kernels.paged_attention import paged_decode_library

NUM_SEQS, SEQ_LEN = 24, 256  # like the standard workload's steps at >= 16 rows (~200 keys each)
MAX_POOL_BYTES = 512 << 20  # fewer sequences for a model whose K/V would pass it (still far past the cache)
SCRAMBLE = -0x61C8864680B583EB  # odd, so i -> i * SCRAMBLE (mod 2**64) takes every i elsewhere
PTR, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@functools.cache
def read_pages() -> Callable[..., int]:
    """paged_decode.c's read_pages, typed here rather than with the kernel's own functions: `bench
    --ab` loads older builds of paged_decode.c, which have no such function."""
    function = paged_decode_library().read_pages
    function.argtypes = [PTR] * 4 + [I64] * 5 + [INT] * 2
    function.restype = ctypes.c_uint64
    return function


@dataclass(slots=True)
class KVPool:
    """Every layer's K and V, [num_layers, 2, num_blocks, kv_heads, block_size, head_dim], every 8
    bytes a different, scrambled number (an untouched page would be the kernel's one shared zero
    page; consecutive numbers would cancel in an XOR), and the sequences' block tables: the blocks
    dealt out to them in a random order."""

    pool: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor  # [num_seqs] int32

    @classmethod
    def random(
        cls, shape: ModelShape, dtype: torch.dtype, block_size: int, num_seqs: int, seq_len: int, seed: int = 0
    ) -> KVPool:
        blocks_each = -(-seq_len // block_size)
        num_blocks = num_seqs * blocks_each
        dims = (shape.num_layers, 2, num_blocks, shape.num_kv_heads, block_size, shape.head_dim)
        words = torch.arange(torch.Size(dims).numel() * dtype.itemsize // 8).mul_(SCRAMBLE)  # each different
        pool = words.view(dtype).view(dims)
        order = random.Random(seed).sample(range(num_blocks), num_blocks)
        tables = torch.tensor(order, dtype=torch.int32).view(num_seqs, blocks_each)
        return cls(pool, tables, torch.full((num_seqs,), seq_len, dtype=torch.int32))

    @property
    def bytes_read(self) -> int:
        """The K and V rows of every sequence's tokens, in every layer."""
        layers, _, _, kv_heads, _, head_dim = self.pool.shape
        row_bytes = head_dim * self.pool.element_size()
        return layers * 2 * kv_heads * int(self.seq_lens.sum()) * row_bytes

    def read(self, layer: int) -> int:
        """One layer's pages, as a decode step's attention reads them: the XOR of every 8 bytes."""
        _, _, _, kv_heads, block_size, head_dim = self.pool.shape
        kv = self.pool[layer]
        return read_pages()(
            kv.data_ptr(),
            kv[1].data_ptr(),
            self.block_tables.data_ptr(),
            self.seq_lens.data_ptr(),
            len(self.seq_lens),
            kv_heads,
            head_dim,
            block_size,
            self.block_tables.shape[1],
            int(self.pool.dtype == torch.bfloat16),
            torch.get_num_threads(),
        )

    def read_all(self) -> None:
        for layer in range(self.pool.shape[0]):
            self.read(layer)


def probe_sequences(shape: ModelShape, dtype: torch.dtype) -> int:
    """How many sequences of SEQ_LEN keys the probe's pool holds: NUM_SEQS, fewer for a model whose
    K/V would pass MAX_POOL_BYTES."""
    key_bytes = ByteModel.of(shape, dtype.itemsize).kv_bytes_per_key
    return max(1, min(NUM_SEQS, MAX_POOL_BYTES // (key_bytes * SEQ_LEN)))


def kv_bytes_a_step(shape: ModelShape, dtype: torch.dtype) -> int:
    """The K/V bytes a step of the probe's sequences reads (what passes between two reads of a weight
    in such a step: efficiency.py's ceiling reads as much between its calls)."""
    return probe_sequences(shape, dtype) * SEQ_LEN * ByteModel.of(shape, dtype.itemsize).kv_bytes_per_key


def measure_kv_reads(
    shape: ModelShape, dtype: torch.dtype, block_size: int, weight_bytes: int = 0, min_time: float = 0.5
) -> dict:
    """GB/s at which a step's K/V pages are read as the decode kernel reads them, every layer in turn,
    with the threads torch uses now; between two reads of the pool, weight_bytes of other memory
    (a step's weights) are read, untimed, so that its pages come from where a step finds them."""
    num_seqs = probe_sequences(shape, dtype)
    kv = KVPool.random(shape, dtype, block_size, num_seqs, SEQ_LEN)
    between = other_reads(weight_bytes) if weight_bytes else None
    seconds = time_call(kv.read_all, torch.device("cpu"), min_time=min_time, between=between)
    return {
        "gb_s": round(kv.bytes_read / seconds / 1e9, 2),
        "dtype": str(dtype).removeprefix("torch."),
        "sequences": num_seqs,
        "keys_each": SEQ_LEN,
        "mb_a_step": round(kv.bytes_read / 1e6, 1),
        "read_between_mb": round(weight_bytes / 1e6, 1),
        "threads": torch.get_num_threads(),
    }
