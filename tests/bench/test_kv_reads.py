"""The bench's probe of attention's reads alone: every K and V row a decode step's attention reads,
and only those, read as the kernel reads them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tracer.bench import kv_reads
from tracer.bench.kv_reads import KVPool, kv_bytes_a_step, measure_kv_reads
from tracer.bench.model_shape import ModelShape

SHAPE = ModelShape(3, 64, 4, 2, 16, 128, 300)  # 2 KV heads of 16 numbers a row


def xor_of_rows(kv: KVPool, layer: int) -> int:
    """What attention must read of one layer, folded as read_pages folds it: each sequence's first
    seq_len rows of K and of V, in every KV head, XOR-ed 8 bytes at a time."""
    pool = kv.pool[layer]  # [2, num_blocks, kv_heads, block_size, head_dim]
    block_size = pool.shape[3]
    seen = np.uint64(0)
    for table, length in zip(kv.block_tables.tolist(), kv.seq_lens.tolist()):
        for token in range(length):
            block = table[token // block_size]
            rows = pool[:, block, :, token % block_size].contiguous()  # K and V, every head
            seen ^= np.bitwise_xor.reduce(rows.view(torch.int64).numpy().astype(np.uint64).ravel())
    return int(seen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_read_pages_reads_every_row_attention_reads_and_no_other(dtype, threads, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    kv = KVPool.random(SHAPE, dtype, block_size=4, num_seqs=3, seq_len=10, seed=1)  # last block half full
    assert sorted(kv.block_tables.flatten().tolist()) == list(range(kv.pool.shape[2]))  # each block once
    for layer in range(SHAPE.num_layers):
        assert kv.read(layer) == xor_of_rows(kv, layer) != 0
    # the rows past the end of a sequence are not read: other bits there change nothing
    last_block, other = kv.block_tables[0, -1], kv.pool[2]  # layer 2's numbers are all different
    before = kv.read(0)
    kv.pool[0, :, last_block, :, 2:] = other[:, last_block, :, 2:]
    assert kv.read(0) == before
    kv.pool[0, 1, last_block, 1, 1] = other[1, last_block, 1, 1]  # a value row it does read
    assert kv.read(0) != before


def test_measure_kv_reads_counts_the_bytes_of_its_rows():
    got = measure_kv_reads(SHAPE, torch.float32, block_size=16, weight_bytes=3 << 20, min_time=0.01)
    rows = 24 * 256 * SHAPE.num_layers * 2 * SHAPE.num_kv_heads  # NUM_SEQS x SEQ_LEN keys, K and V
    assert got["mb_a_step"] == pytest.approx(rows * SHAPE.head_dim * 4 / 1e6, abs=0.1)
    assert kv_bytes_a_step(SHAPE, torch.float32) == rows * SHAPE.head_dim * 4  # what the ceiling reads between
    assert got["gb_s"] > 0 and got["dtype"] == "float32" and got["threads"] == torch.get_num_threads()
    assert got["read_between_mb"] == pytest.approx(3 * 1.048576, abs=0.1)


def test_measure_kv_reads_reads_a_steps_weights_between_two_reads_of_its_pool(monkeypatch):
    """A step reads its weights between two reads of a page: the probe reads as many bytes of its own
    between two reads of its pool, untimed (a pool read back to back would come from the cache
    wherever the last-level cache holds much of it)."""
    events: list[str] = []
    monkeypatch.setattr(kv_reads, "other_reads", lambda n: lambda: events.append(f"other {n}"))
    monkeypatch.setattr(KVPool, "read_all", lambda self: events.append("pool"))
    measure_kv_reads(SHAPE, torch.float32, block_size=16, weight_bytes=5 << 20, min_time=0.0)
    assert events == ["pool"] + ["other 5242880", "pool"] * 3  # a warm-up, then three timed reads
    events.clear()
    measure_kv_reads(SHAPE, torch.float32, block_size=16, min_time=0.0)
    assert events == ["pool"] * 4


def test_measure_kv_reads_takes_fewer_sequences_where_the_pool_would_be_large():
    wide = ModelShape(40, 4096, 32, 32, 128, 11008, 300)  # 1.3 MB of K/V a key in float32
    got = measure_kv_reads(wide, torch.float32, block_size=16, min_time=0.01)
    assert got["sequences"] == 1 and got["mb_a_step"] == pytest.approx(256 * 40 * 2 * 32 * 128 * 4 / 1e6, abs=0.1)
