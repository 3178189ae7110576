"""The model's weights marked for 2 MiB pages (Linux's transparent huge pages), for a long-lived
engine: the kernel's khugepaged thread moves them there in the background, within minutes.

A decode step reads every weight once. With the usual 4 kB pages that is one address translation
per 4 kB read, and the CPU's translation cache holds a few thousand: streaming 270-540 MB a token
misses it all the time. In 2 MiB pages the same weights need 512 times fewer. On the Sapphire
Rapids host of docs/benchmarks.md (seventeenth round) the single stream ran 14 % faster in
float32 and 5 % in bfloat16 with the weights in huge pages; batches of 16-32 did not move.

Why not move them at once (MADV_COLLAPSE, Linux 6.1): on that host, a virtual machine, a fresh
2 MiB page cost ~10 ms, 0.2-3.8 s for a model, more than a short run gains. Marked, the weights
move at khugepaged's pace (16 MB every 10 s by default) on a CPU's spare time, and a long-lived
engine gets the faster steps after its first minutes. The numbers do not move, only the pages that hold them.
Where the system's setting is `never`, or this is not Linux, nothing changes.

A server also moves them itself while it has no request to run (move_to_huge_pages, Linux 6.1's
MADV_COLLAPSE, a page at a time): on the Zen 3 VM of docs/benchmarks.md (forty-second round) the
steps were then 4.5 % shorter at 16-32 rows, 6 % at 4-15 and 12 % at 1-3, for 2-6 ms of idle time a
2 MiB page (0.55-2.3 s for the default model), where khugepaged takes minutes."""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Iterable, Iterator

import torch

from nanoengine.model import Linear

HUGE_PAGE = 2 << 20  # bytes: x86-64's transparent huge page
MADV_HUGEPAGE = 14  # <linux/mman.h>
MADV_COLLAPSE = 25  # Linux 6.1: move the memory into huge pages now
GIVE_UP_AFTER = 16  # pages in a row that could not be moved: the system moves none on request


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
