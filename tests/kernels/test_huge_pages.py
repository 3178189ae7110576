"""The weights marked for 2 MiB pages (tracer/kernels/huge_pages.py): every page a weight touches,
its ends included; moved there a page at a time (as a server does while idle), they lie in huge
pages, no bit of any weight changes and the kernels still read them; where nothing can be moved the
mover gives up; a move in a time budget stops at it; memory asked for huge pages before its first
touch is marked for them."""

from __future__ import annotations

import math
import mmap
import re
import sys

import pytest
import torch

from nanoengine.loading.build import pack_for_onednn
from nanoengine.model import ONEDNN, Linear
from tracer.kernels.huge_pages import (
    GIVE_UP_AFTER,
    HUGE_PAGE,
    MADV_HUGEPAGE,
    empty_in_huge_pages,
    huge_page_spans,
    madvise,
    mark_for_huge_pages,
    move_to_huge_pages,
    move_weights,
    runs_of,
    weight_bytes,
    weight_pages,
)
from tracer.kernels.packed_linear import few_rows_first

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux's transparent huge pages")


def system_takes_the_mark() -> bool:
    """Whether this kernel accepts MADV_HUGEPAGE at all (not where built without huge pages)."""
    advise = madvise()
    buffer = mmap.mmap(-1, 2 * HUGE_PAGE, flags=mmap.MAP_PRIVATE)
    start = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    return advise is not None and advise(start - start % HUGE_PAGE + HUGE_PAGE, HUGE_PAGE, MADV_HUGEPAGE) == 0


takes_the_mark = pytest.mark.skipif(
    sys.platform != "linux" or not system_takes_the_mark(), reason="this kernel has no transparent huge pages"
)


def mappings() -> list[tuple[int, int, str]]:
    """This process's mappings from /proc/self/smaps: (start, end, VmFlags)."""
    found: list[tuple[int, int, str]] = []
    for line in open("/proc/self/smaps"):
        span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            found.append((int(span[1], 16), int(span[2], 16), ""))
        elif line.startswith("VmFlags:"):
            found[-1] = (*found[-1][:2], line.split(":", 1)[1])
    return found


def marked(page: int, maps: list[tuple[int, int, str]]) -> bool:
    """Whether every mapping the 2 MiB page at `page` lies in asks for huge pages (VmFlags hg)."""
    parts = [flags for start, end, flags in maps if start < page + HUGE_PAGE and page < end]
    return bool(parts) and all(" hg" in flags for flags in parts)


def inside_one_mapping(page: int, maps: list[tuple[int, int, str]]) -> bool:
    return any(start <= page and page + HUGE_PAGE <= end for start, end, _ in maps)


def test_the_spans_cover_both_ends():
    assert list(huge_page_spans(HUGE_PAGE - 1, 2)) == [0, HUGE_PAGE]
    assert list(huge_page_spans(3 * HUGE_PAGE, HUGE_PAGE)) == [3 * HUGE_PAGE]
    assert list(huge_page_spans(3 * HUGE_PAGE + 5, 1)) == [3 * HUGE_PAGE]


def test_adjacent_pages_make_one_run():
    pages = [5 * HUGE_PAGE, HUGE_PAGE, 2 * HUGE_PAGE, HUGE_PAGE, 7 * HUGE_PAGE, 6 * HUGE_PAGE]
    assert runs_of(pages) == [range(HUGE_PAGE, 3 * HUGE_PAGE), range(5 * HUGE_PAGE, 8 * HUGE_PAGE)]


def linears(packed: bool) -> list[Linear]:
    """Two weights: packed by oneDNN where it lays them out, else side by side in one buffer, the
    first smaller than a huge page and across a 2 MiB boundary (its two pages shared with others)."""
    gen = torch.Generator().manual_seed(0)
    shapes = ((640, 576), (3072, 576))
    buffer = torch.zeros((8 * HUGE_PAGE) // 4)  # float32
    offset = (-buffer.data_ptr() % HUGE_PAGE + HUGE_PAGE - 4096) // 4  # 4 kB before a boundary
    made = []
    for out_features, in_features in shapes:
        linear = Linear(in_features, out_features, bias=False)
        weight = torch.randn(out_features, in_features, generator=gen)
        if packed:
            linear.weight.data = weight
            pack_for_onednn(linear)
        else:
            linear.weight.data = buffer[offset : offset + weight.numel()].view_as(weight).copy_(weight)
            offset += weight.numel()
        made.append(linear)
    return made


PACKED = [False, pytest.param(True, marks=pytest.mark.skipif(not ONEDNN, reason="x86 torch packs for oneDNN"))]


@takes_the_mark
@pytest.mark.parametrize("packed", PACKED)
def test_every_page_a_weight_touches_is_marked(packed):
    layers = linears(packed)
    before = mappings()
    pages = [p for layer in layers for p in huge_page_spans(*weight_bytes(layer)) if inside_one_mapping(p, before)]
    assert len(pages) >= 2  # the 7 MB weight's own pages at least
    assert mark_for_huge_pages(layers) >= len(set(pages)) * HUGE_PAGE
    after = mappings()
    assert all(marked(p, after) for p in pages)


def huge_bytes_in(pages: list[int]) -> int:
    """AnonHugePages of the mappings that hold these 2 MiB pages (/proc/self/smaps), in bytes."""
    total, holds = 0, False
    for line in open("/proc/self/smaps"):
        span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            start, end = int(span[1], 16), int(span[2], 16)
            holds = any(start <= page < end for page in pages)
        elif holds and line.startswith("AnonHugePages:"):
            total += int(line.split()[1]) * 1024
    return total


@pytest.mark.parametrize("packed", PACKED)
def test_weights_moved_into_huge_pages_lie_there_and_keep_their_bits(packed):
    layers = linears(packed)
    matmuls = [few_rows_first(layer, {}) for layer in layers]  # the kernels hold the addresses
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(1))
    before = [matmul(x) for matmul in matmuls]
    mark_for_huge_pages(layers)
    pages = weight_pages(layers)
    assert pages == sorted({p for layer in layers for p in huge_page_spans(*weight_bytes(layer))})
    moved = sum(move_to_huge_pages(pages))  # a page each time it is advanced
    if not moved:
        pytest.skip("this system moves no memory into huge pages on request (Linux < 6.1 or THP off)")
    assert moved >= 2 * HUGE_PAGE  # the 7 MB weight's own pages at least
    assert huge_bytes_in(pages) >= moved  # each page moved lies in a huge page now
    assert all(torch.equal(matmul(x), y) for matmul, y in zip(matmuls, before))


def test_the_mover_gives_up_where_no_page_can_be_moved():
    buffer = mmap.mmap(-1, 64 * HUGE_PAGE, flags=mmap.MAP_PRIVATE)
    start = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    first = start - start % HUGE_PAGE + HUGE_PAGE
    buffer.close()  # unmapped: no page there can be moved
    pages = [first + i * HUGE_PAGE for i in range(40)]
    assert list(move_to_huge_pages(pages)) == [0] * (GIVE_UP_AFTER - 1)


@pytest.mark.parametrize("packed", PACKED)
def test_a_move_with_no_time_moves_nothing_and_with_all_the_time_every_page(packed):
    layers = linears(packed)
    pages = weight_pages(layers)
    none = move_weights(layers, 0)
    assert none.moved == 0 and none.pages == len(pages) * HUGE_PAGE
    every = move_weights(layers, math.inf)
    if not every.moved:
        pytest.skip("this system moves no memory into huge pages on request (Linux < 6.1 or THP off)")
    assert every.pages == len(pages) * HUGE_PAGE
    assert every.moved >= 2 * HUGE_PAGE  # the 7 MB weight's own pages at least
    assert huge_bytes_in(pages) >= every.moved


@takes_the_mark
def test_memory_asked_for_huge_pages_is_marked_whole_pages_and_all():
    numel = (8 * HUGE_PAGE + 12345) // 4
    tensor = empty_in_huge_pages(numel).fill_(1.5)
    assert tensor.numel() == numel and tensor.data_ptr() % HUGE_PAGE == 0
    assert float(tensor.sum()) == 1.5 * numel
    # whether the system then has a free huge page at each first touch is its own affair (it falls
    # back to 4 kB pages when it has none): what is asked is that every whole 2 MiB page be one
    maps = mappings()
    assert all(marked(page, maps) for page in range(tensor.data_ptr(), tensor.data_ptr() + 8 * HUGE_PAGE, HUGE_PAGE))
