"""time_call: the best of several timed calls, with what runs between them left out of the times."""

from __future__ import annotations

import time

import torch

from tracer.bench.timing import other_reads, time_call


def test_time_call_runs_between_before_each_timed_call_and_leaves_it_out():
    calls: list[str] = []

    def between() -> None:
        calls.append("between")
        time.sleep(0.05)

    best = time_call(lambda: calls.append("call"), torch.device("cpu"), min_time=0.0, between=between)
    assert calls == ["call"] + ["between", "call"] * 3  # a warm-up, then three timed calls
    assert best < 0.05  # between's sleep is not in the time


def test_other_reads_reads_that_many_bytes_of_its_own():
    read = other_reads(1 << 20)
    assert read.__self__.nbytes == 1 << 20 and float(read()) == (1 << 20) / 4  # a buffer of ones, summed


def test_other_reads_stops_past_any_cache(monkeypatch):
    """A larger model's weights (GBs) need not be copied to be read between: past the cache, any
    buffer does."""
    monkeypatch.setattr("tracer.bench.timing.OTHER_READS_MAX", 1 << 16)
    assert other_reads(1 << 20).__self__.nbytes == 1 << 16
