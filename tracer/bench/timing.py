"""How long a call takes at the machine's best: the timing both measured limits (the GEMM peak in
efficiency.py, the memory bandwidth in roofline.py) are read with."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tracer.bench.metrics import synchronize

if TYPE_CHECKING:
    import torch


def time_call(fn: Callable[[], object], device: torch.device, min_time: float = 0.15, max_reps: int = 50) -> float:
    """The fastest of several timed calls (after one warm-up), at least min_time in all: the machine's
    limit is its best rate, and on a shared machine slower repeats only measure other processes."""
    fn()
    times: list[float] = []
    while len(times) < 3 or (sum(times) < min_time and len(times) < max_reps):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)
