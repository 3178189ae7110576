"""The compiled paged-decode kernel (tracer/kernels) against the engine's torch path: equal outputs
on ragged batches, scattered pages, grouped-query heads, float32 and bfloat16; the same engine
run (chunked prefill, preemption, prefix hits, beams) through either backend; and one line, never
a traceback, where the machine cannot build it."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import BUSY_OPTIONS, BUSY_REQUESTS, make_tiny_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoengine.attention import AttentionMetadata, TorchAttention
from nanoengine.beam_search import BeamSearchParams
from nanoengine.engine import LLMEngine
from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams
from tracer.kernels import KERNEL, paged_attention
from tracer.kernels.build import AVX2_ONLY, FLAGS, KernelUnavailable, build, cpu_flags, has_avx2, library_path
from tracer.kernels.choose import build_engine, with_attention_kernel
from tracer.kernels.fused_decoder import FusedDecoder
from tracer.kernels.paged_attention import SOURCE, PagedDecodeAttention, paged_decode, paged_decode_library

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


# (q's dtype, the cache's): the model's own, or a bfloat16 cache under float32 (kv_cache_dtype)
DTYPE_PAIRS = [(torch.float32,) * 2, (torch.bfloat16,) * 2, (torch.float32, torch.bfloat16)]


def decode_batch(
    lens: list[int], block_size: int, kv_heads: int, group: int, dim: int, dtype, seed: int, kv_dtype=None
):
    """A KV pool with each sequence's pages scattered through it (in kv_dtype, else dtype), and one
    query per sequence."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = [(n + block_size - 1) // block_size for n in lens]
    pool = sum(num_blocks) + 3
    kv = torch.randn(2, pool, kv_heads, block_size, dim, generator=gen).to(kv_dtype or dtype)
    pages = torch.randperm(pool, generator=gen).tolist()
    tables = torch.zeros(len(lens), max(num_blocks), dtype=torch.int32)
    for i, n in enumerate(num_blocks):
        tables[i, :n] = torch.tensor([pages.pop() for _ in range(n)])
    q = torch.randn(len(lens), kv_heads * group, dim, generator=gen).to(dtype)
    return q, kv, tables, torch.tensor(lens, dtype=torch.int32)


def torch_decode(q, kv, tables, lens, scale):
    """The engine's own decode path on the same inputs (one group at these batch sizes)."""
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(len(lens), dtype=torch.long),
        query_start_loc=torch.arange(len(lens) + 1, dtype=torch.int32),
        seq_lens=lens,
        block_tables=tables,
        max_query_len=1,
        max_seq_len=int(lens.max()),
        decodes=[(i, i, n) for i, n in enumerate(lens.tolist())],
        prefills=[],
    )
    return TorchAttention()(q, kv, meta, scale)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=6),
    block_size=st.sampled_from([1, 4, 16]),
    heads=st.sampled_from([(1, 1), (2, 1), (3, 3), (2, 4)]),  # (kv_heads, query heads per kv head)
    dim=st.sampled_from([8, 12, 64, 128]),  # 64 and 128 take loops of a known length
    dtypes=st.sampled_from(DTYPE_PAIRS),
    seed=st.integers(0, 1000),
)
def test_kernel_equals_the_torch_path(lens, block_size, heads, dim, dtypes, seed):
    """Also with a bfloat16 cache under float32: both widen its numbers exactly, so only the order of
    the float32 sums differs."""
    dtype, kv_dtype = dtypes
    q, kv, tables, seq_lens = decode_batch(lens, block_size, *heads, dim, dtype, seed, kv_dtype)
    ours = paged_decode(q, kv, tables, seq_lens, dim**-0.5)
    theirs = torch_decode(q, kv, tables, seq_lens, dim**-0.5)
    assert ours.dtype == dtype and ours.shape == q.shape
    torch.testing.assert_close(ours.float(), theirs.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_the_comparison_catches_a_kernel_that_misses_the_newest_token():
    """The bug a paged kernel is most likely to have (an off-by-one in the length or the last page)
    is caught by the comparison above: the same inputs with each sequence one token short differ."""
    q, kv, tables, lens = decode_batch([5, 17, 33], 4, 2, 2, 64, torch.float32, seed=1)
    short = paged_decode(q, kv, tables, lens - 1, 64**-0.5)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(short, torch_decode(q, kv, tables, lens, 64**-0.5))


CPU_FLAGS = set(cpu_flags().split())


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(
            "native", marks=pytest.mark.skipif(not ("avx512f" in CPU_FLAGS or has_avx2()), reason="no wide copy")
        ),
        pytest.param("avx2", marks=pytest.mark.skipif(not has_avx2(), reason="the AVX2 build needs AVX2 and FMA")),
    ],
)
@settings(max_examples=30, deadline=None)
@given(
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=5),
    block_size=st.sampled_from([1, 5, 16, 32]),
    heads=st.sampled_from([(3, 3), (2, 4), (1, 7), (2, 1), (1, 9)]),  # 7, 9: over a values sweep, a keys sweep
    dim=st.sampled_from([64, 128]),  # the head dims the vector copies take
    dtypes=st.sampled_from(DTYPE_PAIRS),
    seed=st.integers(0, 1000),
)
def test_the_vector_loops_give_the_plain_loops_bits(build, lens, block_size, heads, dim, dtypes, seed):
    """attend_wide (AVX-512, or AVX2: this CPU's build, and the AVX2 code built on any x86 CPU) sums
    16 or 8 tokens' scores at once with its lanes turned, in the order dot() adds them: the same
    numbers, bit for bit, as the plain loops; one token less differs."""
    q, kv, tables, lens = decode_batch(lens, block_size, heads[0], heads[1], dim, dtypes[0], seed, dtypes[1])
    library = paged_decode_library(SOURCE, AVX2_ONLY if build == "avx2" else FLAGS)
    with mock.patch.object(paged_attention, "paged_decode_library", lambda: library):
        wide = paged_decode(q, kv, tables, lens, 0.125)
        assert torch.equal(wide, paged_decode(q, kv, tables, lens, 0.125, plain=True))
        if int(lens.max()) > 1:
            shorter = lens - (lens == lens.max()).int()
            assert not torch.equal(wide, paged_decode(q, kv, tables, shorter, 0.125, plain=True))


@pytest.mark.parametrize("offset", [1, 3, 5])
def test_a_sequence_gets_the_same_bits_wherever_its_buffers_lie(offset):
    """Sums in one fixed order: the cache and the query moved off their alignment give the very same
    numbers (a vectorised sum that peels for alignment would not: a request's logprobs would then
    change with the batch it runs in)."""
    q, kv, tables, lens = decode_batch([7, 40, 64], 16, 3, 3, 64, torch.float32, seed=2)
    moved_kv = torch.empty(kv.numel() + offset)[offset:].view(kv.shape)
    moved_q = torch.empty(q.numel() + offset)[offset:].view(q.shape)
    moved_kv.copy_(kv), moved_q.copy_(q)
    assert torch.equal(paged_decode(moved_q, moved_kv, tables, lens, 0.125), paged_decode(q, kv, tables, lens, 0.125))


@pytest.mark.parametrize("bad", ["outside the pool", "negative", "too short for the length", "empty"])
def test_a_bad_block_table_is_refused_not_read_out_of_bounds(bad):
    """The torch path raises on an index outside the pool; the kernel must too, not read past it."""
    q, kv, tables, lens = decode_batch([5, 9], 4, 1, 2, 8, torch.float32, seed=3)
    if bad == "outside the pool":
        tables[1, 2] = kv.shape[1]
    elif bad == "negative":
        tables[0, 0] = -1
    elif bad == "too short for the length":
        lens[1] = tables.shape[1] * 4 + 1
    else:
        lens[0] = 0
    with pytest.raises(IndexError, match="block table points outside the KV pool"):
        paged_decode(q, kv, tables, lens, 1.0)


def test_bad_inputs_are_refused_in_one_line():
    q, kv, tables, lens = decode_batch([3], 4, 1, 1, 8, torch.float32, seed=0)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        paged_decode(q.half(), kv.half(), tables, lens, 1.0)
    with pytest.raises(ValueError, match="a torch.float32 cache"):  # a cache wider than q: never made
        paged_decode(q.bfloat16(), kv, tables, lens, 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        paged_decode(q[:, :, :4].contiguous(), kv, tables, lens, 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        paged_decode(q, kv, tables, torch.cat([lens, lens]), 1.0)
    with pytest.raises(ValueError, match="contiguous"):
        paged_decode(q, kv.transpose(3, 4).contiguous().transpose(3, 4), tables, lens, 1.0)


class Recording:
    """Wraps a backend; keeps every attention call's output, to compare two runs call by call."""

    def __init__(self, backend):
        self.backend, self.outputs = backend, []

    def cache_shape(self, *args):
        return self.backend.cache_shape(*args)

    def write_kv(self, *args):
        return self.backend.write_kv(*args)

    def __call__(self, q, kv, meta, scale):
        out = self.backend(q, kv, meta, scale)
        self.outputs.append(out.clone())
        return out


def run_busy(backend, dtype: str, kv_cache_dtype: str = "auto") -> tuple[list, Recording]:
    """The busy workload (every kind of scheduler decision), greedy; each request's tokens."""
    recording = Recording(backend)
    options = {**BUSY_OPTIONS, "attention_backend": recording, "dtype": dtype, "kv_cache_dtype": kv_cache_dtype}
    engine = make_tiny_engine(**options)
    ids, step = [], 0
    while step == 0 or engine.has_unfinished():
        for prompt, max_tokens, arrival in BUSY_REQUESTS:
            if arrival == step:
                ids.append(
                    engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
                )
        engine.step()
        step += 1
        assert step < 200
    return [engine.collect(i).outputs[0].token_ids for i in ids], recording


@pytest.mark.parametrize("dtype, kv_cache_dtype", [("float32", "auto"), ("bfloat16", "auto"), ("float32", "bfloat16")])
def test_an_engine_run_through_the_kernel_equals_the_torch_run(dtype, kv_cache_dtype):
    """Chunked prefill beside decodes, preemption and prefix-cache hits (the busy workload): every
    attention call of the run gives the torch path's output, so every token is the same; also with
    a bfloat16 cache under float32, which both paths write rounded and read widened."""
    ours, ours_calls = run_busy(PagedDecodeAttention(), dtype, kv_cache_dtype)
    theirs, theirs_calls = run_busy(TorchAttention(), dtype, kv_cache_dtype)
    assert ours == theirs
    assert len(ours_calls.outputs) == len(theirs_calls.outputs) > 0
    tol = TOLERANCE[getattr(torch, dtype)]
    for a, b in zip(ours_calls.outputs, theirs_calls.outputs):
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


def test_a_cache_the_kernel_does_not_take_runs_the_torch_path():
    """A float16 cache under float32 (kv_cache_dtype="float16"): the backend hands every row to the
    torch path, whose tokens the run then has, and the tools leave the decoder unfused."""
    ours, ours_calls = run_busy(PagedDecodeAttention(), "float32", "float16")
    theirs, _ = run_busy(TorchAttention(), "float32", "float16")
    assert ours == theirs and ours_calls.outputs
    engine = build_engine("tiny", {"kv_cache_dtype": "float16", "num_kv_blocks": 64})
    assert engine.runner.kv_caches[0].dtype == torch.float16
    assert isinstance(engine.runner.attend, PagedDecodeAttention) and not isinstance(engine.runner.model, FusedDecoder)


def test_beams_through_the_kernel_find_the_torch_beams():
    """Beam search forks and copies blocks on write: the kernel reads the copies through the table."""
    params = BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True)
    found = []
    for backend in (PagedDecodeAttention(), TorchAttention()):
        (out,) = LLM("tiny", block_size=4, attention_backend=backend).beam_search(["the cat sat on"], params)
        found.append([beam.tokens for beam in out.sequences])
    assert found[0] == found[1] and len(found[0]) == 3


def test_the_tools_pick_the_kernel_on_cpu_and_the_torch_path_on_request():
    assert isinstance(with_attention_kernel({})["attention_backend"], PagedDecodeAttention)
    assert isinstance(with_attention_kernel({"attention_backend": KERNEL})["attention_backend"], PagedDecodeAttention)
    assert with_attention_kernel({"attention_backend": "torch"})["attention_backend"] == "torch"
    engine = LLMEngine("tiny", **with_attention_kernel({"attention_backend": "auto"}))
    assert isinstance(engine.runner.attend, PagedDecodeAttention)


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    """A machine without a C compiler, and this process not holding the library it loaded before."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path / "cache"))
    paged_decode_library.cache_clear()
    yield
    paged_decode_library.cache_clear()


@pytest.mark.usefixtures("no_compiler")
def test_without_a_compiler_auto_falls_back_and_cpu_kernel_says_why():
    with pytest.raises(KernelUnavailable, match="no C compiler"):
        build(SOURCE)
    assert with_attention_kernel({"attention_backend": "auto"})["attention_backend"] == "auto"
    with pytest.raises(ValueError, match=f"^attention_backend {KERNEL}: no C compiler") as error:
        with_attention_kernel({"attention_backend": KERNEL})
    assert "\n" not in str(error.value)


def test_a_failed_build_is_one_line_and_leaves_nothing_behind(monkeypatch, tmp_path):
    cc = tmp_path / "cc"
    cc.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo fake 1; exit 0; fi\necho "error: out of ink" >&2\nexit 1\n'
    )
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(KernelUnavailable, match="cc could not build paged_decode.c: error: out of ink"):
        build(SOURCE)
    assert list((tmp_path / "cache" / "kernels").iterdir()) == []


def test_a_cache_it_cannot_write_is_one_line(monkeypatch, tmp_path):
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    monkeypatch.setenv("NANOENGINE_CACHE", str(blocked))
    with pytest.raises(KernelUnavailable, match="cannot write the kernel to .*a file, not a folder"):
        build(SOURCE)


def test_a_build_is_cached_per_source(monkeypatch, tmp_path):
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path))
    first = build(SOURCE)
    built_at = first.stat().st_mtime_ns
    assert build(SOURCE) == first and first.stat().st_mtime_ns == built_at  # not compiled again
    edited = tmp_path / "paged_decode.c"
    edited.write_text(SOURCE.read_text() + "\n/* edited */\n")
    (tmp_path / "rotary.h").write_text(SOURCE.with_name("rotary.h").read_text())
    header = tmp_path / "floats.h"
    header.write_text(SOURCE.with_name("floats.h").read_text())
    cc = os.environ.get("CC", "cc")
    assert library_path(edited, cc) != library_path(SOURCE, cc)
    assert build(edited).exists() and build(edited) != first
    before = library_path(edited, cc)
    header.write_text(header.read_text() + "\n/* a header it includes, edited */\n")
    assert library_path(edited, cc) != before  # a header's edit is a new build too
    assert not [p for p in Path(tmp_path, "kernels").iterdir() if not p.name.endswith(".so")]


def test_a_kernel_that_includes_another_is_rebuilt_when_that_one_changes(tmp_path):
    """decode_layers.c includes three kernels' sources: an edit to any of them is a new build."""
    kernels = SOURCE.parent
    for source in [*kernels.glob("*.c"), *kernels.glob("*.h")]:
        (tmp_path / source.name).write_text(source.read_text())
    cc = os.environ.get("CC", "cc")
    before = library_path(tmp_path / "decode_layers.c", cc)
    included = tmp_path / "packed_gemv.c"
    included.write_text(included.read_text() + "\n/* edited */\n")
    assert library_path(tmp_path / "decode_layers.c", cc) != before


def test_the_engine_takes_a_backend_object_and_refuses_anything_else():
    backend = TorchAttention()
    assert LLMEngine("tiny", attention_backend=backend).runner.attend is backend
    with pytest.raises(ValueError, match="attention_backend must be auto, torch, flash or a backend: 5"):
        LLMEngine("tiny", attention_backend=5)
