"""The bench's timed engine run (tracer/bench/engine.py: run_engine) and what it measures beside it."""

from __future__ import annotations

from tracer.bench import engine as bench_engine
from tracer.bench.workload import BenchRequest


def test_run_engine_keeps_each_batchs_best_ceiling_of_before_and_after_the_run(monkeypatch):
    """A VM slow for the few seconds of one measurement must not set the ceiling: it is measured
    before the timed run and after it, and each batch keeps the better rate."""
    events: list[str] = []
    rates = iter([{"16": 1.0, "32": 5.0}, {"16": 2.0, "32": 4.0}])

    def measure_linear_ceiling(model, kernels, between_bytes):
        events.append("ceiling")
        assert between_bytes > 0  # a step's K/V read between two runs of the linears
        return next(rates)

    real_run_requests = bench_engine.run_requests

    def run_requests(engine, requests, name="nanoengine"):
        events.append(name)
        return real_run_requests(engine, requests, name)

    monkeypatch.setattr(bench_engine, "measure_linear_ceiling", measure_linear_ceiling)
    monkeypatch.setattr(bench_engine, "run_requests", run_requests)
    requests = [BenchRequest((5, 6, 7, 8), 3), BenchRequest((9, 10), 4)]
    run = bench_engine.run_engine("tiny", {"num_threads": 1}, requests, requests[:1], model_only=False)
    assert events == ["warm-up", "ceiling", "nanoengine", "ceiling"]
    assert run.linear_ceiling == {"16": 2.0, "32": 5.0}
    assert run.result.num_output_tokens == 7
