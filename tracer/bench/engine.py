"""nanoengine's side of the benchmark: the timed run, the run with the step recorder on, the
model-only replay and the start-up time."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from nanoengine.engine import LLMEngine
from nanoengine.sampling_params import SamplingParams
from tracer.bench.efficiency import ModelShape, measure_linear_ceiling
from tracer.bench.kv_reads import kv_bytes_a_step, measure_kv_reads
from tracer.bench.metrics import RunResult, measured_run, synchronize
from tracer.bench.model_only import ForwardProbe, replay_forwards
from tracer.bench.roofline import ByteModel
from tracer.bench.workload import BenchRequest
from tracer.kernels.choose import build_engine
from tracer.kernels.fused_decoder import FusedDecoder
from tracer.kernels.huge_pages import Moved, move_weights
from tracer.kernels.packed_linear import agree_all
from tracer.kernels.paged_attention import PagedDecodeAttention


@dataclass(slots=True)
class EngineRun:
    result: RunResult
    num_steps: int = 0
    model_time: float = 0.0  # seconds inside runner.run (forward + sampling): StepRecord.model_time
    model_only_time: float | None = None
    extra: dict = field(default_factory=dict)
    shape: ModelShape | None = None  # for the FLOP count
    linear_ceiling: dict[str, float] | None = None  # GFLOP/s of the model's linears alone, by decode batch
    kv_reads: dict | None = None  # its KV pool's pages read as its decode kernel reads them (kv_reads.py)

    def to_dict(self) -> dict:
        elapsed = self.result.elapsed
        d = {
            "num_steps": self.num_steps,
            "model_time_s": round(self.model_time, 4),
            "overhead_share": round(1 - self.model_time / elapsed, 4),
            **self.extra,
        }
        if self.model_only_time is not None:
            d["model_only_s"] = round(self.model_only_time, 4)
            d["total_over_model_only"] = round(elapsed / self.model_only_time, 4)
        return d


def greedy_params(request: BenchRequest) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=request.max_tokens, ignore_eos=True)


def run_requests(engine: LLMEngine, requests: list[BenchRequest], name: str = "nanoengine") -> RunResult:
    """Add every request at t = 0, step until all are done, timestamp each token as it appears."""
    synchronize(engine.device)
    start, cpu_start = time.perf_counter(), time.process_time()
    ids = [engine.add_request(list(r.prompt_token_ids), greedy_params(r)) for r in requests]
    index = {seq_id: i for i, seq_id in enumerate(ids)}
    token_times: list[list[float]] = [[] for _ in requests]
    while engine.has_unfinished():
        gained = engine.step()
        now = time.perf_counter()
        for seq in gained:
            token_times[index[seq.seq_id]].append(now)
    elapsed, cpu_time = time.perf_counter() - start, time.process_time() - cpu_start
    outputs = [engine.collect(i).token_ids for i in ids]
    return measured_run(name, requests, outputs, token_times, start, elapsed, cpu_time)


def warm_up(engine: LLMEngine, requests: list[BenchRequest]) -> None:
    """A few short requests; first, the few-row kernels' checks at every row count (agree_all),
    which the steps that first meet a row count would otherwise run inside the timed run."""
    decoder = engine.runner.model
    if isinstance(decoder, FusedDecoder):
        agree_all(decoder.linears())
    run_requests(engine, requests, "warm-up")


def bench_engine(model: str, options: dict) -> tuple[LLMEngine, Moved]:
    """The engine the bench times: the tools' (build_engine), its weights moved into huge pages
    whatever that takes, before any timed run: the engine as it settles in a long run or in a server
    that has been idle (huge_pages.py); what the move took, for the report."""
    engine = build_engine(model, options, move_seconds=0)
    if engine.device.type != "cpu":
        return engine, Moved(0, 0, 0.0)
    return engine, move_weights(engine.model.modules(), math.inf)


def run_engine(
    model: str, options: dict, requests: list[BenchRequest], warmup: list[BenchRequest], model_only: bool = True
) -> EngineRun:
    """The main timed run on a fresh engine; then the model-only replay of its forward passes. The
    decode ceiling is measured before the run and after it, and each batch's best rate kept: a VM
    slow for a few seconds made one run in three of the forty-third and forty-sixth rounds measure
    a ceiling 25-35 % low, and with it a reach too low and a share of it too high."""
    engine, moved = bench_engine(model, options)
    warm_up(engine, warmup)
    shape = ModelShape.of(engine.model.config)
    ceiling = linear_ceiling_of(engine, shape)
    before = ceiling()
    probe = ForwardProbe(engine)
    result = run_requests(engine, requests)
    probe.detach()
    run = EngineRun(
        result,
        probe.num_steps,
        probe.model_time,
        extra={
            "num_kv_blocks": engine.config.num_kv_blocks,
            "block_size": engine.config.block_size,
            "max_num_batched_tokens": engine.config.max_num_batched_tokens,
            "max_num_seqs": engine.config.max_num_seqs,
            "kv_itemsize": engine.runner.kv_caches[0].element_size(),  # kv_cache_dtype's, or the model's
            "huge_pages": {"moved_mib": moved.moved >> 20, "of_mib": moved.pages >> 20, "s": round(moved.seconds, 3)},
        },
        shape=shape,
    )
    if model_only:
        run.model_only_time = replay_forwards(engine, probe.inputs)
    run.linear_ceiling = best_rates(before, ceiling())
    if isinstance(engine.runner.attend, PagedDecodeAttention):
        weight_bytes = ByteModel.of(shape, next(engine.model.parameters()).element_size()).weight_bytes
        run.kv_reads = measure_kv_reads(shape, engine.runner.kv_caches[0].dtype, engine.config.block_size, weight_bytes)
    return run


def linear_ceiling_of(engine: LLMEngine, shape: ModelShape) -> Callable[[], dict[str, float]]:
    """The decode ceiling of the engine's model with its own kernels for the linears where it has
    them, a step's K/V read between two runs of them (efficiency.py: measure_linear_ceiling)."""
    decoder = engine.runner.model
    kernels = decoder.linears() if isinstance(decoder, FusedDecoder) else None
    kv_bytes = kv_bytes_a_step(shape, engine.runner.kv_caches[0].dtype)
    return partial(measure_linear_ceiling, engine.model, kernels, between_bytes=kv_bytes)


def best_rates(*measures: dict[str, float]) -> dict[str, float]:
    """Each batch's best rate of several measurements of the ceiling: the machine's limit is its
    best rate (as time_call takes the fastest of its calls)."""
    return {rows: max(m[rows] for m in measures) for rows in measures[0]}


def run_traced(
    model: str, options: dict, requests: list[BenchRequest], warmup: list[BenchRequest], trace_path: Path | None = None
) -> tuple[RunResult, dict]:
    """The same workload on a fresh engine with the step recorder writing a JSONL trace."""
    from tracer.trace.recorder import TraceRecorder

    engine, _ = bench_engine(model, options)
    warm_up(engine, warmup)
    # Direct cost of recording: a step's record.wall_time is taken before the record is built and
    # the hooks run, so (time of step()) - wall_time is exactly what recording adds to that step.
    wall_times, step_times = [], []
    engine.add_step_hook(lambda record: wall_times.append(record.wall_time))
    untimed_step = engine.step

    def timed_step():
        start = time.perf_counter()
        gained = untimed_step()
        step_times.append(time.perf_counter() - start)
        return gained

    engine.step = timed_step  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        path = trace_path or Path(tmp) / "bench-trace.jsonl"
        wall_times.clear()
        step_times.clear()
        with TraceRecorder(engine, path, title="nanoengine bench") as recorder:
            # The header first, as a live viewer and the server write it: the tokenizer's digest and
            # the engine's sources, once, 40-50 ms; timed as its own figure, not in a step's share.
            start = time.perf_counter()
            recorder.start()
            header_s = time.perf_counter() - start
            result = run_requests(engine, requests, "nanoengine + tracer")
        recording = sum(step_times) - sum(wall_times)
        info = {
            "trace_bytes": path.stat().st_size,
            "trace_steps": recorder.num_steps,
            "violations": len(recorder.violations),
            "header_s": round(header_s, 4),
            "recording_s": round(recording, 4),
            "recording_share": round(recording / (result.elapsed - recording), 4),
        }
        if trace_path:
            info["trace_path"] = str(trace_path)
    return result, info


STARTUP_SCRIPT = """\
import json, sys, time
t0 = time.perf_counter()
from nanoengine import LLM, SamplingParams
t1 = time.perf_counter()
llm = LLM(model=sys.argv[1], **json.loads(sys.argv[2]))
t2 = time.perf_counter()
llm.generate("Hello", SamplingParams(max_tokens=1))
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "build_s": t2 - t1, "first_token_s": t3 - t2,
                  "first_token_at": time.time()}, allow_nan=False))
"""


STARTUP_RUNS = 3


def measure_startup(model: str, options: dict, runs: int = STARTUP_RUNS, timeout: float = 300) -> dict:
    """The median of `runs` fresh processes (by total_s; one process alone moves by +-0.4 s on a
    2-core machine), with every run's total_s beside it."""
    measured = []
    for _ in range(runs):
        one = measure_startup_once(model, options, timeout)
        if "error" in one:
            return one
        measured.append(one)
    measured.sort(key=lambda m: m["total_s"])
    return {**measured[len(measured) // 2], "runs_total_s": [m["total_s"] for m in measured]}


def measure_startup_once(model: str, options: dict, timeout: float = 300) -> dict:
    """A fresh `python -c` that imports nanoengine, builds LLM() from cached weights and generates
    one token. total_s: from launching the process (interpreter start included) to the first token;
    process_s: the whole process, its exit (torch's slow teardown) included."""
    cmd = [sys.executable, "-c", STARTUP_SCRIPT, model, json.dumps(options, allow_nan=False)]
    launched = time.time()
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"start-up run took over {timeout:.0f} s"}
    total = time.perf_counter() - start
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"start-up run failed: {last}"}
    parts = json.loads(proc.stdout.strip().splitlines()[-1])
    first_token = parts.pop("first_token_at") - launched
    return {
        "total_s": round(first_token, 3),
        "process_s": round(total, 3),
        **{k: round(v, 3) for k, v in parts.items()},
    }
