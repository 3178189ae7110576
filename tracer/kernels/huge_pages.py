"""The model's weights in 2 MiB pages (Linux's transparent huge pages).

A decode step reads every weight once. With the usual 4 kB pages that is one address translation
per 4 kB read, and the CPU's translation cache holds a few thousand: streaming 270-540 MB a token
misses it all the time, and in a virtual machine each miss walks two sets of page tables. In 2 MiB
pages the same weights need 512 times fewer. Measured (docs/benchmarks.md): on the AMX Xeon VM of
the forty-ninth round decode steps 0.92-0.96x the time at 16-32 rows, 0.89-0.93x at 4-15 and
0.88-0.90x at 1-3 (two engines stepping in turns), and a plain read of 256 MiB at ~38 GB/s in
huge pages against ~24 in 4 kB pages; on the Zen 3 VM of the forty-second round 4.5-12 % shorter
steps. The numbers do not move, only the pages that hold them.

How they get there. The weights are marked (MADV_HUGEPAGE), so that the kernel's khugepaged thread
moves them within minutes, and moved at once (Linux 6.1's MADV_COLLAPSE, a page at a time) for as
long as the caller allows (move_weights). What a page costs to move is the cost of a fresh 2 MiB
page: on that VM ~0.6 ms where it reuses memory the guest has used before (0.08 s for the bfloat16
model's 252 MiB) and 3-6 ms where the host must first back it (float32's 520 MiB took 0.3-1.6 s,
with more of its pages fresh).
So a tool's start spends at most MOVE_AT_BUILD_S and leaves the rest to khugepaged; a server moves
the rest while it has no request to run; the bench moves all before its timed runs, and reads its
memory bandwidth in huge pages too, so that its bound stays the machine's (empty_in_huge_pages).
Where the system's setting is `never`, or this is not Linux, nothing changes.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from nanoengine.model import Linear

HUGE_PAGE = 2 << 20  # bytes: x86-64's transparent huge page
MADV_HUGEPAGE = 14  # <linux/mman.h>
MADV_COLLAPSE = 25  # Linux 6.1: move the memory into huge pages now
GIVE_UP_AFTER = 16  # pages in a row that could not be moved: the system moves none on request
MOVE_AT_BUILD_S = 0.25  # the most a tool's start spends moving its weights (build_engine)


@functools.cache
def madvise() -> Callable[[int, int, int], int] | None:
    """libc's madvise(address, length, advice) -> 0 or -1, or None where this is not Linux."""
    if sys.platform != "linux":
        return None
    function = ctypes.CDLL(None, use_errno=True).madvise
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def huge_page_spans(address: int, size: int) -> range:
    """The start of every 2 MiB page that [address, address + size) touches."""
    return range(address - address % HUGE_PAGE, address + size, HUGE_PAGE)


def runs_of(spans: Iterable[int]) -> list[range]:
    """2 MiB page starts as runs of adjacent pages, [start, stop) in bytes, in address order."""
    runs: list[range] = []
    for start in sorted(set(spans)):
        if runs and runs[-1].stop == start:
            runs[-1] = range(runs[-1].start, start + HUGE_PAGE)
        else:
            runs.append(range(start, start + HUGE_PAGE))
    return runs


def weight_bytes(linear: Linear) -> tuple[int, int]:
    """Where a linear's weight lies and how many bytes: packed for oneDNN or a plain tensor."""
    weight = linear.weight
    if weight.is_mkldnn:
        return torch.ops.mkldnn.data_ptr(weight), torch.ops.mkldnn._nbytes(weight)
    return weight.data_ptr(), weight.nbytes


def mark_for_huge_pages(modules: Iterable[torch.nn.Module]) -> int:
    """Every CPU linear's weight among the modules marked (MADV_HUGEPAGE); returns the bytes marked.
    A whole 2 MiB page around each weight's ends: its neighbours, other weights mostly, share it.
    One call a run of adjacent pages; where one fails (part of it not mapped), page by page."""
    advise = madvise()
    if advise is None:
        return 0
    marked = 0
    for run in runs_of(weight_pages(modules)):
        if advise(run.start, len(run), MADV_HUGEPAGE) == 0:
            marked += len(run)
        else:
            marked += sum(HUGE_PAGE for s in run[::HUGE_PAGE] if advise(s, HUGE_PAGE, MADV_HUGEPAGE) == 0)
    return marked


def weight_pages(modules: Iterable[torch.nn.Module]) -> list[int]:
    """The start of every 2 MiB page that a CPU linear's weight among the modules touches, in order."""
    linears = [m for m in modules if isinstance(m, Linear) and m.weight.device.type == "cpu"]
    return sorted({page for linear in linears for page in huge_page_spans(*weight_bytes(linear))})


def move_to_huge_pages(pages: Iterable[int]) -> Iterator[int]:
    """Each 2 MiB page moved into a huge page now (MADV_COLLAPSE), one page each time the iterator is
    advanced, which yields the bytes it moved: 0 for a page that lies across two mappings (the ends
    of the weights' memory), or once GIVE_UP_AFTER pages in a row could not be moved, nothing more
    (a kernel before 6.1, or huge pages `never`). Nothing where this is not Linux."""
    advise = madvise()
    if advise is None:
        return
    failures = 0
    for page in pages:
        moved = advise(page, HUGE_PAGE, MADV_COLLAPSE) == 0
        failures = 0 if moved else failures + 1
        if failures == GIVE_UP_AFTER:
            return
        yield HUGE_PAGE if moved else 0


@dataclass(frozen=True, slots=True)
class Moved:
    """What move_weights did: bytes moved into huge pages (pages already there count), of how many
    the weights' pages hold, in how many seconds."""

    moved: int
    pages: int  # bytes: every 2 MiB page a weight touches
    seconds: float


def move_weights(modules: Iterable[torch.nn.Module], seconds: float) -> Moved:
    """The weights' pages moved into huge pages now, one after the other, until `seconds` have
    passed (0: none; math.inf: all); the rest stay as they are, marked for khugepaged."""
    pages = weight_pages(modules)
    start, moved = time.perf_counter(), 0
    mover = move_to_huge_pages(pages)
    while time.perf_counter() - start < seconds and (page := next(mover, None)) is not None:
        moved += page
    return Moved(moved, len(pages) * HUGE_PAGE, time.perf_counter() - start)


def empty_in_huge_pages(numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An empty CPU tensor whose memory the first touch puts in 2 MiB pages where the system gives
    them (marked before it is written; a last part smaller than 2 MiB stays in 4 kB pages)."""
    buffer = torch.empty(numel + HUGE_PAGE // dtype.itemsize, dtype=dtype)
    skip = (-buffer.data_ptr() % HUGE_PAGE) // dtype.itemsize
    nbytes, advise = numel * dtype.itemsize, madvise()
    if advise is not None:
        advise(buffer.data_ptr() + skip * dtype.itemsize, nbytes - nbytes % HUGE_PAGE, MADV_HUGEPAGE)
    return buffer[skip : skip + numel]
