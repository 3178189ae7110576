"""`nanoengine bench`: throughput vs Hugging Face transformers, engine and tracer overheads, start-up.

The workload and every measurement are described in docs/benchmarks.md.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from tracer.bench.machine import describe_cpu
from tracer.bench.metrics import RunResult, count_matching
from tracer.bench.workload import STANDARD, BenchRequest, WorkloadSpec, build_workload, workload_summary

if TYPE_CHECKING:
    from tracer.bench.engine import EngineRun

SCHEMA = "nanoengine-bench/1"


@dataclass(slots=True)
class BenchSettings:
    model: str = "default"
    workload: WorkloadSpec = STANDARD
    device: str | None = None  # None: cuda when available
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    threads: int | None = None
    engine_options: dict = field(default_factory=dict)  # LLMEngine knobs (max_num_seqs, ...)
    hf_batch_size: int | None = None  # static generate batch size; None: all requests at once
    cb_options: dict = field(default_factory=dict)  # ContinuousBatchingConfig fields; none: its sizing
    repeat: int = 1  # nanoengine runs (plain and traced), fastest kept
    skip_hf: bool = False
    skip_generate_batch: bool = False
    skip_hf_onednn: bool = False  # the static generate baseline again with oneDNN linears (x86 CPU, float32)
    skip_model_only: bool = False
    skip_tracer: bool = False
    skip_startup: bool = False
    skip_single: bool = False  # the single-stream rows (tracer/bench/single.py)
    skip_bf16: bool = False  # the bfloat16 nanoengine row beside a float32 CPU run
    profile: bool = False  # one more nanoengine run under torch.profiler: time per category and phase
    trace_out: Path | None = None


# ---- the run ------------------------------------------------------------------------------------
def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def resolve_device(settings: BenchSettings):
    import torch

    name = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA device: use --device cpu")
    from nanoengine.loading.engine_parts import choose_dtype

    device = torch.device(name)
    return device, str(choose_dtype(settings.dtype, device)).removeprefix("torch.")


def vocab_size_of(model: str) -> int:
    from nanoengine.loading.checkpoint import DEFAULT_MODEL, ensure_default_model, load_model
    from nanoengine.loading.tiny import tiny_config

    if model == "tiny":
        return tiny_config().vocab_size
    path = ensure_default_model() if model in ("default", DEFAULT_MODEL) else Path(model).expanduser()
    if (path / "config.json").exists():
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path).vocab_size
    return load_model(model).config.vocab_size


def warmup_requests(spec: WorkloadSpec, vocab_size: int) -> list[BenchRequest]:
    """Two short requests with other token ids (no prefix-cache hits on the real workload)."""
    warm = WorkloadSpec(
        num_requests=2,
        min_input_len=8,
        max_input_len=32,
        min_output_len=4,
        max_output_len=8,
        seed=spec.seed + 1_000_003,
    )
    return build_workload(warm, vocab_size)


def run_benchmark(settings: BenchSettings) -> dict:
    import torch
    import transformers

    import nanoengine
    from nanoengine.loading.engine_parts import idle_cores
    from tracer.bench.efficiency import Roofline, measure_gemm_peak, model_flops_summary, run_efficiency
    from tracer.bench.engine import measure_startup
    from tracer.bench.report import evaluate_targets
    from tracer.bench.roofline import ByteModel, measure_memory_bandwidth
    from tracer.kernels.choose import attention_in_use

    # one thread count for every system measured (unset: what the engine would choose, once, up front)
    threads = settings.threads or idle_cores()
    torch.set_num_threads(threads)
    device, dtype = resolve_device(settings)
    options = {**settings.engine_options, "device": device.type, "dtype": dtype, "num_threads": threads}
    vocab_size = vocab_size_of(settings.model)
    requests = build_workload(settings.workload, vocab_size)
    warmup = warmup_requests(settings.workload, vocab_size)
    summary = workload_summary(settings.workload, requests)
    log(
        f"workload: {len(requests)} requests, {summary['num_prompt_tokens']} prompt + "
        f"{summary['num_output_tokens']} output tokens; model {settings.model}, {device.type}, {dtype}, "
        f"{torch.get_num_threads()} threads, {attention_in_use(options)}"
    )

    engine_run = run_nanoengine(settings, options, requests, warmup, not settings.skip_model_only)
    main = engine_run.result
    runs = {"nanoengine": main.to_dict()}
    results = {"nanoengine": main}
    assert engine_run.shape is not None
    log("GEMM peak ...")
    peaks = [measure_gemm_peak(engine_run.shape, device, getattr(torch, dtype))]
    log("memory bandwidth ...")
    bandwidths = [measure_memory_bandwidth(device)]
    bf16_skipped = bf16_skip_reason(settings, device, dtype)
    beside_float32 = device.type == "cpu" and dtype == "float32"  # else its one row is the dtype asked
    bf16 = run_bf16(settings, options, requests, warmup, device) if beside_float32 and not bf16_skipped else None
    if bf16 is not None:
        runs[BF16_RUN] = bf16.run_dict(main)
    if not settings.skip_hf:
        kv_tokens = engine_run.extra["num_kv_blocks"] * engine_run.extra["block_size"]
        for key, result in run_hf_baselines(settings, requests, warmup, device, dtype, kv_tokens).items():
            results[key] = result
            runs[key] = {
                **result.to_dict(),
                "nanoengine_speedup": round(main.output_tok_s / result.output_tok_s, 3),
                "matching_requests": count_matching(main.outputs, result.outputs),
            }
        log("GEMM peak again ...")
        peaks.append(measure_gemm_peak(engine_run.shape, device, getattr(torch, dtype)))
        bandwidths.append(measure_memory_bandwidth(device))
        if bf16 is not None:
            bf16.peaks.append(measure_gemm_peak(engine_run.shape, device, torch.bfloat16))
    peak = max(peaks, key=lambda p: p["gflop_s"])
    bandwidth = max(bandwidths, key=lambda b: b["gb_s"])
    itemsize = getattr(torch, dtype).itemsize
    roofline = Roofline(bandwidth["gb_s"] * 1e9, ByteModel.of(engine_run.shape, itemsize))
    kv_itemsize = engine_run.extra.get("kv_itemsize", itemsize)  # nanoengine's own KV bytes
    own_roofline = Roofline(bandwidth["gb_s"] * 1e9, ByteModel.of(engine_run.shape, itemsize, kv_itemsize))
    efficiency = {
        key: run_efficiency(
            engine_run.shape,
            requests,
            result.token_times,
            result.elapsed,
            peak["gflop_s"] * 1e9,
            result.cpu_time,
            torch.get_num_threads(),
            own_roofline if key == "nanoengine" else roofline,
            steps_stamped=key == "nanoengine",
        )
        for key, result in results.items()
    }
    bf16_report = None
    if bf16 is not None:
        efficiency[BF16_RUN] = bf16.efficiency(requests, bandwidth["gb_s"] * 1e9, torch.get_num_threads())
        efficiency = {key: efficiency[key] for key in runs}  # the throughput table's order
        bf16_report = bf16.to_dict()
    single = None
    if not (settings.skip_single or device.type == "cuda"):
        single = measure_single(settings, options, vocab_size, engine_run.shape, bandwidth["gb_s"])
    tracer = None if settings.skip_tracer else measure_tracer(settings, options, requests, warmup, main.elapsed)
    startup = None
    if not settings.skip_startup:  # before the profiler run, which left later processes ~1 s slower to start
        log("start-up time (fresh python process) ...")
        startup = measure_startup(settings.model, options)
    profile = None
    if settings.profile:
        from tracer.bench.op_profile import profile_engine

        log("nanoengine under torch.profiler ...")
        profile = profile_engine(settings.model, options, requests, warmup)

    report = {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": settings.model,
        "device": device.type,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "attention": attention_in_use(options),
        "cpu": describe_cpu(),
        "versions": {
            "nanoengine": nanoengine.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": sys.version.split()[0],
        },
        "workload": summary,
        "engine_options": options,
        "runs": runs,
        "engine": engine_run.to_dict(),
        "tracer": tracer,
        "startup": startup,
        "model_flops": model_flops_summary(engine_run.shape),
        "gemm_peak": {
            **peak,
            "measured_gflop_s": [p["gflop_s"] for p in peaks],
            "model_linears_gflop_s": engine_run.linear_ceiling,
        },
        "memory_bandwidth": {
            **bandwidth,
            "measured_gb_s": [b["gb_s"] for b in bandwidths],
            "weight_mb_per_step": round(roofline.bytes.weight_bytes / 1e6, 1),
            "kv_kb_per_key": round(own_roofline.bytes.kv_bytes_per_key / 1e3, 2),  # nanoengine's
            "kv_reads": engine_run.kv_reads,
        },
        "efficiency": efficiency,
        "bf16": bf16_report,
        "bf16_skipped": bf16_skipped,
        "profile": profile,
        "single": single,
    }
    report["targets"] = evaluate_targets(report)
    return report


def run_single_benchmark(settings: BenchSettings) -> dict:
    """`nanoengine bench --single-only`: the single-stream rows alone, with the bandwidth they are
    measured against."""
    import torch

    from nanoengine.loading.checkpoint import load_model
    from nanoengine.loading.engine_parts import idle_cores
    from tracer.bench.model_shape import ModelShape
    from tracer.bench.roofline import measure_memory_bandwidth
    from tracer.kernels.choose import attention_in_use

    torch.set_num_threads(settings.threads or idle_cores())
    device, _ = resolve_device(settings)
    if device.type != "cpu":
        raise ValueError("the single-stream rows are a CPU measure: use --device cpu")
    options = {**settings.engine_options, "device": "cpu", "num_threads": torch.get_num_threads()}
    loaded = load_model(settings.model)
    vocab_size, shape = loaded.config.vocab_size, ModelShape.of(loaded.config)
    del loaded
    log("memory bandwidth ...")
    bandwidth = measure_memory_bandwidth(device)
    single = measure_single(settings, options, vocab_size, shape, bandwidth["gb_s"])
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": settings.model,
        "threads": torch.get_num_threads(),
        "attention": attention_in_use(options),
        "cpu": describe_cpu(),
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
        "memory_bandwidth": bandwidth,
        "single": single,
    }


def run_nanoengine(settings: BenchSettings, options: dict, requests, warmup, model_only: bool) -> EngineRun:
    """The timed nanoengine run(s), each on a fresh engine; the fastest is kept."""
    from tracer.bench.engine import run_engine

    best = None
    for i in range(settings.repeat):
        log(f"nanoengine ({options['dtype']}) run {i + 1}/{settings.repeat} ...")
        run = run_engine(settings.model, options, requests, warmup, model_only=model_only)
        if best is None or run.result.elapsed < best.result.elapsed:
            best = run
        gc.collect()
    assert best is not None, "repeat >= 1"
    return best


# ---- the bfloat16 row -----------------------------------------------------------------------------
BF16_RUN = "nanoengine_bf16"  # its key in the report's runs and efficiency
BF16_ITEMSIZE = 2  # bytes per weight and per K/V element
NO_BF16_CPU = (
    "no bfloat16 row: this CPU has neither AVX512_BF16 nor AMX, so bfloat16 would be emulated (slower than float32)"
)
BF16_LEFT_OUT = "no bfloat16 row: left out with --skip-bf16"


def bf16_skip_reason(settings: BenchSettings, device, dtype: str) -> str | None:
    """Why a float32 CPU run gets no bfloat16 row beside it; None where it gets one, or where the
    run is not float32 on CPU (its one row is then the only dtype asked for)."""
    from nanoengine.loading.engine_parts import cpu_has_bf16

    if device.type != "cpu" or dtype != "float32":
        return None
    if settings.skip_bf16:
        return BF16_LEFT_OUT
    return None if cpu_has_bf16() else NO_BF16_CPU


@dataclass(slots=True)
class Bf16Run:
    """nanoengine in bfloat16 on the same workload, with its own GEMM peak and decode ceiling."""

    engine: EngineRun
    peaks: list[dict]

    @property
    def peak(self) -> dict:
        return max(self.peaks, key=lambda p: p["gflop_s"])

    def run_dict(self, float32: RunResult) -> dict:
        """Its throughput row, with its ratio to the float32 run and how many requests got float32's
        exact tokens (bfloat16 may flip a near-tie: reported, never an error)."""
        result = self.engine.result
        return {
            **result.to_dict(),
            "dtype": "bfloat16",
            "over_float32": round(result.output_tok_s / float32.output_tok_s, 3),
            "matching_requests": count_matching(result.outputs, float32.outputs),
        }

    def efficiency(self, requests, bandwidth: float, threads: int) -> dict:
        """Its phases against the bfloat16 peak and a roofline of 2-byte weights and K/V."""
        from tracer.bench.efficiency import Roofline, run_efficiency
        from tracer.bench.roofline import ByteModel

        shape, result = self.engine.shape, self.engine.result
        assert shape is not None
        roofline = Roofline(bandwidth, ByteModel.of(shape, BF16_ITEMSIZE))
        peak = self.peak["gflop_s"] * 1e9
        return run_efficiency(
            shape,
            requests,
            result.token_times,
            result.elapsed,
            peak,
            result.cpu_time,
            threads,
            roofline,
            steps_stamped=True,
        )

    def to_dict(self) -> dict:
        from tracer.bench.roofline import ByteModel

        assert self.engine.shape is not None
        nbytes = ByteModel.of(self.engine.shape, BF16_ITEMSIZE)
        return {
            "gemm_peak": {
                **self.peak,
                "measured_gflop_s": [p["gflop_s"] for p in self.peaks],
                "model_linears_gflop_s": self.engine.linear_ceiling,
            },
            "weight_mb_per_step": round(nbytes.weight_bytes / 1e6, 1),
            "kv_kb_per_key": round(nbytes.kv_bytes_per_key / 1e3, 2),
            "kv_reads": self.engine.kv_reads,
            "engine": {
                "num_steps": self.engine.num_steps,
                "model_time_s": round(self.engine.model_time, 4),
                "huge_pages": self.engine.extra.get("huge_pages"),
            },
        }


def run_bf16(settings: BenchSettings, options: dict, requests, warmup, device) -> Bf16Run:
    """A fresh engine with the same threads and options, in bfloat16; its GEMM peak right after."""
    import torch

    from tracer.bench.efficiency import measure_gemm_peak

    engine = run_nanoengine(settings, {**options, "dtype": "bfloat16"}, requests, warmup, model_only=False)
    assert engine.shape is not None
    log("GEMM peak in bfloat16 ...")
    return Bf16Run(engine, [measure_gemm_peak(engine.shape, device, torch.bfloat16)])


def measure_single(settings: BenchSettings, options: dict, vocab_size: int, shape, bandwidth_gb_s: float) -> dict:
    from tracer.bench.llama_cpp import skip_reason
    from tracer.bench.roofline import ByteModel
    from tracer.bench.single import run_batch, run_single, single_report

    weight_bytes = {name: ByteModel.of(shape, size).weight_bytes for name, size in (("float32", 4), ("bfloat16", 2))}
    results = run_single(settings.model, options, vocab_size, weight_bytes, settings.skip_hf, log)
    gc.collect()
    batch = run_batch(settings.model, options, vocab_size, log)
    gc.collect()
    report = single_report(results, bandwidth_gb_s)
    return {**report, "batch": batch, "llama_cpp_skipped": skip_reason(settings.model)}


def cb_options_for(settings: BenchSettings, kv_tokens: int) -> dict:
    """generate_batch's cache holds as many tokens as nanoengine's, unless told otherwise. Left to size
    itself on CPU, it claims 90% of the machine's free RAM (and fills its attention-mask buffers)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    page_size = ContinuousBatchingConfig().page_size
    return {"num_blocks": -(-kv_tokens // page_size), **settings.cb_options}


def run_hf_baselines(settings: BenchSettings, requests, warmup, device, dtype, kv_tokens: int) -> dict:
    import torch

    from tracer.bench.hf import (
        load_hf_model,
        onednn_linears,
        quiet_transformers,
        run_hf_generate,
        run_hf_generate_batch,
        warm_up_generate,
    )

    results = {}
    with quiet_transformers():
        hf_model = load_hf_model(settings.model, device, getattr(torch, dtype))
        log(f"HF generate (static batch of {settings.hf_batch_size or len(requests)}) ...")
        warm_up_generate(hf_model, warmup)
        results["hf_generate"] = run_hf_generate(hf_model, requests, settings.hf_batch_size)
        if not settings.skip_hf_onednn:
            with onednn_linears(hf_model) as swapped:
                if swapped:
                    log("HF generate with oneDNN linears (nanoengine's GEMM library) ...")
                    results["hf_generate_onednn"] = run_hf_generate(
                        hf_model, requests, settings.hf_batch_size, "HF generate (oneDNN)"
                    )
        if not settings.skip_generate_batch:
            log("HF generate_batch (continuous batching) ...")
            results["hf_generate_batch"] = run_hf_generate_batch(
                hf_model, requests, warmup, cb_options_for(settings, kv_tokens)
            )
        del hf_model
        gc.collect()
    return results


def measure_tracer(settings: BenchSettings, options: dict, requests, warmup, plain_elapsed: float) -> dict:
    from tracer.bench.engine import run_traced

    best: RunResult | None = None
    info: dict = {}
    for i in range(settings.repeat):
        log(f"nanoengine with the step recorder, run {i + 1}/{settings.repeat} ...")
        result, run_info = run_traced(settings.model, options, requests, warmup, settings.trace_out)
        if best is None or result.elapsed < best.elapsed:
            best, info = result, run_info
        gc.collect()
    assert best is not None, "repeat >= 1"
    return {
        "elapsed_s": round(best.elapsed, 4),
        "plain_elapsed_s": round(plain_elapsed, 4),
        "overhead": round(best.elapsed / plain_elapsed - 1, 4),
        "output_tok_s": round(best.output_tok_s, 2),
        **info,
    }
