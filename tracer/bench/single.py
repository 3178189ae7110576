"""The single stream: one prompt, 64 new tokens, greedy, batch 1 - the first thing a newcomer runs.

Each system generates the same prompt SINGLE_RUNS times (after one warm-up); the report keeps the
median run by decode rate, with every run's rate beside it. nanoengine's float32 and bfloat16 runs
take turns (float32, bfloat16, float32, ...): the pace of a VM drifts by ~10 % within minutes, and
taking turns puts the same drift on both sides of the bfloat16-over-float32 ratio.

    TTFT      from handing over the prompt to the first new token (the prefill)
    tok/s     decode rate: (tokens after the first) / (time from the first token to the last)
    of bound  tok/s against the batch-1 bandwidth bound: a decode step reads every weight once, so
              no system exceeds memory bandwidth / weight bytes tokens a second (the K/V of a
              short context adds well under 1 % to the bytes and is left out). The bandwidth is
              measured after each round of runs (a probe: the roofline's stream kernels, briefly)
              and a row's bound takes the median of its rounds: a VM's memory moves from minute
              to minute (44-90 GB/s within an hour on one host), so a bandwidth measured minutes
              before the runs made the share swing from 46 % to 83 % between two benches

nanoengine runs in float32 and bfloat16 (an engine each), HF generate at batch 1 in the
same dtypes, llama.cpp (tracer/bench/llama_cpp.py) when llama-cpp-python is installed.

Beside it, the same prompt length and output in a batch of BATCH requests at once (BATCHED), for
nanoengine in float32 and llama.cpp (the standard workload's HF rows are the main bench's).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tracer.bench.workload import BenchRequest, WorkloadSpec, build_workload

SINGLE_RUNS = 5
PROBE_S = 0.1  # each stream kernel's time in a bandwidth probe
SINGLE = WorkloadSpec(num_requests=1, min_input_len=32, max_input_len=32, min_output_len=64, max_output_len=64, seed=7)
DTYPES = ("float32", "bfloat16")
BATCH = 32
BATCHED = WorkloadSpec(num_requests=BATCH, min_input_len=32, max_input_len=32, min_output_len=64, max_output_len=64)


@dataclass(slots=True)
class SingleRun:
    ttft_s: float
    tok_s: float
    tokens: list[int]
    gb_s: float | None = None  # memory bandwidth measured right after its round; None: not probed


@dataclass(slots=True)
class SingleResult:
    system: str
    dtype: str
    runs: list[SingleRun] = field(default_factory=list)
    weight_bytes: int | None = None  # read per decode step; None: the model's own (set by the caller)
    notes: dict = field(default_factory=dict)

    @property
    def median(self) -> SingleRun:
        return sorted(self.runs, key=lambda r: r.tok_s)[len(self.runs) // 2]

    def to_dict(self, bandwidth_gb_s: float, reference: list[int] | None) -> dict:
        run = self.median
        probed = [r.gb_s for r in self.runs if r.gb_s]
        bandwidth_gb_s = statistics.median(probed) if probed else bandwidth_gb_s
        d: dict = {
            "system": self.system,
            "dtype": self.dtype,
            "ttft_ms": round(run.ttft_s * 1000, 1),
            "tok_s": round(run.tok_s, 2),
            "runs_tok_s": [round(r.tok_s, 2) for r in self.runs],
        }
        if self.weight_bytes:
            bound = bandwidth_gb_s * 1e9 / self.weight_bytes
            d.update(weight_mb=round(self.weight_bytes / 1e6, 1), gb_s=bandwidth_gb_s, bound_tok_s=round(bound, 1))
            d["of_bound"] = round(run.tok_s / bound, 4)
        if reference is not None:
            d["same_tokens"] = run.tokens == reference
        return {**d, **self.notes}


def single_request(vocab_size: int) -> BenchRequest:
    return build_workload(SINGLE, vocab_size)[0]


Generate = Callable[[], tuple[list[float], list[int]]]
Probe = Callable[[], float]  # the memory bandwidth now, GB/s


def bandwidth_probe(device: torch.device) -> Probe:
    """The roofline's bandwidth, measured briefly on buffers kept between calls."""
    from tracer.bench.roofline import measure_memory_bandwidth, stream_kernels

    kernels = stream_kernels(device)
    return lambda: measure_memory_bandwidth(device, kernels=kernels, min_time=PROBE_S)["gb_s"]


def time_runs(generate: Generate, runs: int = SINGLE_RUNS, probe: Probe | None = None) -> list[SingleRun]:
    """generate() returns the time the prompt was handed over followed by each token's time, and the
    token ids; one warm-up call first."""
    return time_in_turns([generate], runs, probe)[0]


def time_in_turns(
    generates: list[Generate], runs: int = SINGLE_RUNS, probe: Probe | None = None
) -> list[list[SingleRun]]:
    """time_runs for several systems at once: each warmed up, then one run of each in turn, `runs`
    times over, the bandwidth probed after each round. Returns each system's runs."""
    for generate in generates:
        generate()
    measured: list[list[SingleRun]] = [[] for _ in generates]
    for _ in range(runs):
        for generate, into in zip(generates, measured):
            times, tokens = generate()
            start, first, last = times[0], times[1], times[-1]
            into.append(SingleRun(first - start, (len(times) - 2) / (last - first), tokens))
        gb_s = probe() if probe else None
        for system_runs in measured:  # each one's last run is this round's
            system_runs[-1].gb_s = gb_s
    return measured


def nanoengine_singles(model: str, options: dict, request: BenchRequest, probe: Probe) -> dict[str, SingleResult]:
    """nanoengine in each of DTYPES, an engine each, their runs taking turns."""
    from tracer.bench.engine import bench_engine

    engines = {dtype: bench_engine(model, {**options, "dtype": dtype})[0] for dtype in DTYPES}
    runs = time_in_turns([generator(engine, request) for engine in engines.values()], probe=probe)
    return {dtype: SingleResult("nanoengine", dtype, r) for dtype, r in zip(engines, runs)}


def generator(engine, request: BenchRequest) -> Generate:
    from tracer.bench.engine import greedy_params

    def generate() -> tuple[list[float], list[int]]:
        times = [time.perf_counter()]
        seq_id = engine.add_request(list(request.prompt_token_ids), greedy_params(request))
        while engine.has_unfinished():
            if engine.step():
                times.append(time.perf_counter())
        return times, engine.collect(seq_id).token_ids

    return generate


def hf_single(model: str, request: BenchRequest, dtype: str, probe: Probe) -> SingleResult:
    from tracer.bench.hf import generate_static, load_hf_model, pad_token_id, quiet_transformers

    with quiet_transformers():
        hf_model = load_hf_model(model, torch.device("cpu"), getattr(torch, dtype))
        pad_id = pad_token_id(hf_model)

        def generate() -> tuple[list[float], list[int]]:
            start = time.perf_counter()
            (tokens,), step_times = generate_static(hf_model, [request], pad_id)
            return [start, *step_times], tokens

        return SingleResult("HF generate", dtype, time_runs(generate, probe=probe))


def run_single(
    model: str, options: dict, vocab_size: int, weight_bytes: dict[str, int], skip_hf: bool, log: Callable[[str], None]
) -> list[SingleResult]:
    """Every single-stream system on this machine; weight_bytes by dtype (float32, bfloat16)."""
    from tracer.bench.llama_cpp import llama_cpp_single

    request = single_request(vocab_size)
    probe = bandwidth_probe(torch.device(options.get("device", "cpu")))
    log(f"single stream: nanoengine, {' and '.join(DTYPES)} in turns ...")
    ours = nanoengine_singles(model, options, request, probe)
    results = []
    for dtype in DTYPES:
        results.append(ours[dtype])
        if not skip_hf:
            log(f"single stream: HF generate at batch 1, {dtype} ...")
            results.append(hf_single(model, request, dtype, probe))
    for result in results:
        result.weight_bytes = weight_bytes[result.dtype]
    log("single stream: llama.cpp ...")
    results.extend(llama_cpp_single(model, request, options.get("num_threads"), probe))
    return results


def single_report(results: list[SingleResult], bandwidth_gb_s: float) -> dict:
    """The rows, each with same_tokens against nanoengine's float32 tokens (greedy: equal numerics
    give equal tokens)."""
    reference = next((r.median.tokens for r in results if r.system == "nanoengine" and r.dtype == "float32"), None)
    rows = [r.to_dict(bandwidth_gb_s, reference) for r in results]
    return {
        "prompt_tokens": SINGLE.min_input_len,
        "new_tokens": SINGLE.min_output_len,
        "runs": SINGLE_RUNS,
        "rows": rows,
    }


def run_batch(model: str, options: dict, vocab_size: int, log: Callable[[str], None]) -> dict:
    """BATCH requests added at once: output tok/s of nanoengine (float32) and llama.cpp, and how many
    requests got nanoengine's greedy tokens."""
    from tracer.bench.engine import bench_engine, run_requests, warm_up
    from tracer.bench.llama_cpp import llama_cpp_batch

    requests = build_workload(BATCHED, vocab_size)
    log(f"batch of {BATCH}: nanoengine, float32 ...")
    engine, _ = bench_engine(model, {**options, "dtype": "float32"})
    warm_up(engine, requests[:2])
    ours = run_requests(engine, requests)
    del engine
    rows: list[dict] = [{"system": "nanoengine", "dtype": "float32", "elapsed_s": round(ours.elapsed, 3)}]
    log(f"batch of {BATCH}: llama.cpp ...")
    for system, dtype, elapsed, outputs in llama_cpp_batch(model, requests, options.get("num_threads")):
        same = sum(a == b for a, b in zip(outputs, ours.outputs))
        rows.append({"system": system, "dtype": dtype, "elapsed_s": round(elapsed, 3), "same_requests": same})
    tokens = sum(r.max_tokens for r in requests)
    for row in rows:
        row["output_tok_s"] = round(tokens / row["elapsed_s"], 2)
    return {"num_requests": BATCH, "prompt_tokens": 32, "new_tokens": 64, "rows": rows}


def stats_line(engine, start: float, first: float | None, end: float, num_tokens: int) -> str:
    """`nanoengine generate --stats`: time to the first token and the decode rate after it."""
    if first is None or num_tokens < 2:
        return f"[stats] {num_tokens} token(s): no decode rate to show"
    linears = [m.weight for m in engine.model.modules() if isinstance(m, torch.nn.Linear)]
    weights = sum(w.numel() * w.element_size() for w in linears)  # the LM head too, tied or not
    rate = (num_tokens - 1) / (end - first) if end > first else float("inf")
    return (
        f"[stats] TTFT {(first - start) * 1000:.0f} ms, decode {rate:.1f} tok/s ({num_tokens - 1} tokens after the "
        f"first); {engine.model.lm_head.weight.dtype}, threads {torch.get_num_threads()}, "
        f"{weights / 1e6:.0f} MB of weights read a step"
    )
