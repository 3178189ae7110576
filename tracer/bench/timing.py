"""How long a call takes at the machine's best: the timing both measured limits (the GEMM peak in
efficiency.py, the memory bandwidth in roofline.py) are read with."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tracer.bench.metrics import synchronize

if TYPE_CHECKING:
    import torch


def time_call(
    fn: Callable[[], object],
    device: torch.device,
    min_time: float = 0.15,
    max_reps: int = 50,
    between: Callable[[], object] | None = None,
) -> float:
    """The fastest of several timed calls (after one warm-up), at least min_time in all: the machine's
    limit is its best rate, and on a shared machine slower repeats only measure other processes.
    `between`, where given, runs before each call, untimed: what else a step reads between two reads
    of the same bytes (other_reads)."""
    fn()
    times: list[float] = []
    while len(times) < 3 or (sum(times) < min_time and len(times) < max_reps):
        if between is not None:
            between()
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


OTHER_READS_MAX = 1 << 30  # past any last-level cache: more would only cost memory (a larger model's weights)


def other_reads(nbytes: int) -> Callable[[], object]:
    """A read of nbytes of memory of its own (at most OTHER_READS_MAX), for time_call's `between`: a
    decode step reads its K/V between two reads of a weight, and its weights between two reads of a
    K/V page, so a probe of either that reads the same bytes back to back times the last-level cache
    wherever that cache holds a good part of them (on the AMX Xeon of docs/benchmarks.md's
    forty-sixth round, 64 MB read at ~56 GB/s and 269 MB at ~31, so K/V pages read back to back came
    at 30-35 GB/s and at ~24 with a step's weights read between)."""
    import torch

    return torch.ones(max(1, min(nbytes, OTHER_READS_MAX) // 4)).sum
