"""`nanoengine bench`: the command line of the benchmark (the run itself is tracer.bench.run)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from nanoengine.config import EngineConfig
from tracer.bench.run import BenchSettings, run_benchmark
from tracer.bench.workload import QUICK, STANDARD
from tracer.cli.defaults import SHOWN, add_lang_arg, default_of
from tracer.cli.help_format import ArgumentParser
from tracer.kernels import ATTENTION_BACKENDS, KV_CACHE_DTYPES


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(
        prog="nanoengine bench",
        description="Benchmark nanoengine against Hugging Face transformers on the standard workload "
        "(see docs/benchmarks.md).",
        epilog="Also: `nanoengine bench --sharing --help` (KV blocks saved by n samples or beams sharing "
        "blocks) and `nanoengine bench --ab --help` (two builds of the compiled kernels taking turns "
        "step by step in one engine).",
    )
    p.add_argument(
        "--model",
        default=default_of(EngineConfig, "model"),
        help=f"'default' (SmolLM2-135M-Instruct), 'tiny' or a model folder {SHOWN}",
    )
    add_lang_arg(p)
    p.add_argument("--quick", action="store_true", help="a short run: 8 requests, prompts 16-64, outputs 8-32 tokens")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    p.add_argument("--out", type=Path, help="also write the JSON results to this file")
    p.add_argument("--num-requests", type=int)
    p.add_argument("--input-len", type=int, nargs=2, metavar=("MIN", "MAX"), help="prompt lengths in tokens")
    p.add_argument("--output-len", type=int, nargs=2, metavar=("MIN", "MAX"), help="output lengths in tokens")
    p.add_argument("--seed", type=int, help="workload seed (default 0)")
    p.add_argument("--device", choices=("cpu", "cuda"))
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "auto"))
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--num-kv-blocks", type=int)
    p.add_argument("--kv-cache-memory-gb", type=float)
    p.add_argument("--attention-backend", choices=ATTENTION_BACKENDS)
    p.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        help="nanoengine's KV cache numbers (default auto: the model's dtype; the baselines keep theirs)",
    )
    p.add_argument("--hf-batch-size", type=int, help="static generate batch size (default: all requests)")
    p.add_argument(
        "--cb-num-blocks",
        type=int,
        help="generate_batch's KV cache in blocks of 256 tokens (default: as many tokens as nanoengine's)",
    )
    p.add_argument("--cb-max-batch-tokens", type=int, help="generate_batch's per-step token budget")
    p.add_argument("--repeat", type=int, default=1, help="repeat the nanoengine runs, keep the fastest")
    p.add_argument("--skip-hf", action="store_true", help="no transformers baselines")
    p.add_argument("--skip-generate-batch", action="store_true", help="no transformers continuous batching baseline")
    p.add_argument(
        "--skip-hf-onednn",
        action="store_true",
        help="no second static generate run with oneDNN linears (nanoengine's GEMM library on x86 CPUs)",
    )
    p.add_argument("--skip-model-only", action="store_true")
    p.add_argument("--skip-tracer", action="store_true")
    p.add_argument("--skip-startup", action="store_true")
    p.add_argument("--skip-single", action="store_true", help="no single-stream rows (one prompt, 64 tokens, batch 1)")
    p.add_argument(
        "--skip-bf16",
        action="store_true",
        help="no bfloat16 nanoengine row beside a float32 CPU run (it runs where the CPU has AVX512_BF16 or AMX)",
    )
    p.add_argument(
        "--single-only",
        action="store_true",
        help="only the single-stream rows: nanoengine, HF generate and llama.cpp at batch 1, float32 and bfloat16",
    )
    p.add_argument(
        "--profile", action="store_true", help="one more nanoengine run under torch.profiler: where the time goes"
    )
    p.add_argument("--trace-out", type=Path, help="keep the tracer run's JSONL trace here")
    p.add_argument(
        "--serving",
        action="store_true",
        help="through the HTTP API: Poisson arrivals, TTFT / TPOT / ITL and goodput (nanoengine serve, "
        "and transformers serve as the anchor unless --skip-hf)",
    )
    p.add_argument(
        "--rate", default="1,inf", help="--serving: request rates in req/s, comma-separated (inf: all at once)"
    )
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0, help="--serving: goodput's TTFT limit")
    p.add_argument("--slo-tpot-ms", type=float, default=200.0, help="--serving: goodput's TPOT limit")
    return p.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    spec = QUICK if args.quick else STANDARD
    if args.num_requests is not None:
        spec = replace(spec, num_requests=args.num_requests)
    if args.input_len:
        spec = replace(spec, min_input_len=args.input_len[0], max_input_len=args.input_len[1])
    if args.output_len:
        spec = replace(spec, min_output_len=args.output_len[0], max_output_len=args.output_len[1])
    if args.seed is not None:
        spec = replace(spec, seed=args.seed)
    spec.validate()
    knobs = {
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs,
        "num_kv_blocks": args.num_kv_blocks,
        "kv_cache_memory_gb": args.kv_cache_memory_gb,
        "attention_backend": args.attention_backend,
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    cb_options = {"num_blocks": args.cb_num_blocks, "max_batch_tokens": args.cb_max_batch_tokens}
    for name, value in (
        ("--threads", args.threads),
        ("--hf-batch-size", args.hf_batch_size),
        ("--repeat", args.repeat),
        ("--cb-num-blocks", args.cb_num_blocks),
        ("--cb-max-batch-tokens", args.cb_max_batch_tokens),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    return BenchSettings(
        model=args.model,
        workload=spec,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        engine_options={k: v for k, v in knobs.items() if v is not None},
        hf_batch_size=args.hf_batch_size,
        cb_options={k: v for k, v in cb_options.items() if v is not None},
        repeat=args.repeat,
        skip_hf=args.skip_hf,
        skip_generate_batch=args.skip_generate_batch,
        skip_hf_onednn=args.skip_hf_onednn,
        skip_model_only=args.skip_model_only,
        skip_tracer=args.skip_tracer,
        skip_startup=args.skip_startup,
        skip_single=args.skip_single,
        skip_bf16=args.skip_bf16,
        trace_out=args.trace_out,
        profile=args.profile,
    )


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        raise ValueError(f"--rate takes request rates separated by commas, e.g. 0.5,1,inf; got {text!r}") from None
    if any(not r > 0 for r in rates):
        raise ValueError(f"--rate values must be > 0 (inf: all at once), got {text!r}")
    return rates


def serving_main(args: argparse.Namespace) -> dict:
    from nanoengine.loading.checkpoint import ensure_default_model, load_model
    from tracer.bench.serving import ServingSettings, run_serving_bench
    from tracer.bench.workload import build_workload

    spec = settings_from_args(args).workload
    rates = parse_rates(args.rate)
    if args.slo_ttft_ms <= 0 or args.slo_tpot_ms <= 0:
        raise ValueError("--slo-ttft-ms and --slo-tpot-ms must be > 0")
    folder = ensure_default_model() if args.model == "default" else Path(args.model)
    tokenizer = load_model(args.model).tokenizer
    vocab_size = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.vocab_size
    requests = build_workload(spec, vocab_size)
    prompts = [tokenizer.decode(list(r.prompt_token_ids), skip_special_tokens=True) for r in requests]
    engine_args = [
        f"--{name.replace('_', '-')}={value}" for name, value in settings_from_args(args).engine_options.items()
    ]
    settings = ServingSettings(
        model=args.model,
        requests=requests,
        prompts=prompts,
        rates=rates,
        threads=args.threads,
        slo_ttft_s=args.slo_ttft_ms / 1000,
        slo_tpot_s=args.slo_tpot_ms / 1000,
        seed=spec.seed,
        model_dir=None if args.skip_hf or not folder.is_dir() else folder,
        engine_args=[a for a in engine_args if not a.startswith(("--kv-cache-memory-gb", "--attention-backend"))],
    )
    report = run_serving_bench(settings, log=lambda line: print(line, file=sys.stderr, flush=True))
    report["workload"] = spec.to_dict()
    return report


def bench_main(argv: list[str]) -> int:
    if argv[:1] == ["--sharing"]:  # KV blocks saved by n samples sharing a prompt: tracer/bench/sharing.py
        from tracer.bench.sharing import main as sharing_main

        return sharing_main(argv[1:], prog="nanoengine bench --sharing")
    if argv[:1] == ["--ab"]:  # two builds of the kernels taking turns in one engine: tracer/bench/ab.py
        from tracer.bench.ab import main as ab_main

        return ab_main(argv[1:], "nanoengine bench --ab", check_writable, ArgumentParser)
    args = parse_args(argv)
    for flag, path in (("--out", args.out), ("--trace-out", args.trace_out)):
        if path is not None:
            check_writable(flag, path)
    if args.trace_out is not None:
        from tracer.cli.trace import out_target

        out_target(args.trace_out)  # the trace command's rule: a trace never replaces a device
    if args.serving:
        from tracer.bench.serving import print_serving_report

        emit_report(serving_main(args), args, print_serving_report)
    elif args.single_only:
        from tracer.bench.report import print_single_report
        from tracer.bench.run import run_single_benchmark

        emit_report(run_single_benchmark(settings_from_args(args)), args, print_single_report)
    else:
        from tracer.bench.report import print_report

        emit_report(run_benchmark(settings_from_args(args)), args, print_report)
    return 0


def check_writable(flag: str, path: Path) -> None:
    """Refuse a file the results could not be written to now, not after minutes of measuring (a
    file this makes to find out is removed again)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = os.path.lexists(path)  # a link, even to nothing, is the user's: never removed
        # O_NONBLOCK: a named pipe without a reader is refused (ENXIO) instead of waited on
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o666))
        if not existed:
            path.unlink()
    except OSError as e:
        raise ValueError(
            f"{flag} {path}: cannot write there ({e.strerror or e}); give a file in a folder you can write to"
        ) from None


def emit_report(report: dict, args: argparse.Namespace, print_table: Callable[[dict], None]) -> None:
    """Print the report as JSON with --json, else as tables; then save its JSON with --out (printed
    first: a file that cannot be written after all loses nothing that was measured)."""
    if args.json:
        print(json.dumps(report, indent=2, allow_nan=False))
    else:
        print_table(report)
    if args.out:  # its folder made by check_writable
        args.out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
