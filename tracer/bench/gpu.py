"""GPU benchmark: nanoengine vs transformers `generate` on a model with Qwen3-0.6B's shape.

Self-contained for a bare, offline machine with torch and transformers: it needs no download and
no cached model. It builds a random-weight Qwen3 with Qwen3-0.6B's shape, saves it with
save_pretrained to a temporary folder, and runs the standard workload scaled up to 256 requests
(docs/benchmarks.md) on nanoengine (CUDA, bfloat16, torch attention backend) and on transformers'
static-batch `generate`, plus the model-only replay. It prints a table and writes JSON.

    python tracer/bench/gpu.py                      # on the GPU machine, from the repository root
    python tracer/bench/gpu.py --tiny-shape         # CPU smoke test: a tiny Qwen3, 8 requests
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a bare checkout: no install needed

from tracer.bench.run import BenchSettings, run_benchmark  # noqa: E402
from tracer.bench.workload import GPU, QUICK  # noqa: E402

QWEN3_0_6B_SHAPE = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    bos_token_id=151643,
    eos_token_id=151645,
)
TINY_SHAPE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=1024,
    tie_word_embeddings=True,
    max_position_embeddings=2048,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="nanoengine vs transformers generate on a Qwen3-0.6B-shaped model")
    p.add_argument("--tiny-shape", action="store_true", help="a tiny Qwen3 and 8 short requests (CPU smoke test)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available, cpu with --tiny-shape")
    p.add_argument(
        "--dtype", choices=("bfloat16", "float16", "float32"), help="default: bfloat16 on cuda, float32 on cpu"
    )
    p.add_argument("--num-requests", type=int, help="default 256 (8 with --tiny-shape)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-cache-memory-gb", type=float, default=16.0)
    p.add_argument("--attention-backend", choices=("torch", "flash", "auto"), default="torch")
    p.add_argument("--hf-batch-size", type=int, help="static generate batch size (default: all requests)")
    p.add_argument("--with-generate-batch", action="store_true", help="also run transformers' continuous batching")
    p.add_argument("--with-tracer", action="store_true", help="also measure the step recorder's overhead")
    p.add_argument("--out", type=Path, default=Path("bench-gpu.json"), help="JSON results (default bench-gpu.json)")
    return p.parse_args(argv)


def build_checkpoint(shape: dict, folder: Path, device: str, dtype: str) -> None:
    """A random-weight Qwen3 of the given shape, saved as a transformers model folder (no tokenizer:
    nanoengine then uses its byte tokenizer, which the token-id workload never touches)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**shape)
    torch.manual_seed(0)
    with torch.device(device):  # initialising 0.6B parameters is much faster on the GPU
        model = Qwen3ForCausalLM(config)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    del model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    device = args.device or ("cpu" if args.tiny_shape or not torch.cuda.is_available() else "cuda")
    if device == "cuda" and not torch.cuda.is_available():
        print(
            "bench_gpu: --device cuda, but torch sees no CUDA device; use --tiny-shape for a CPU smoke test",
            file=sys.stderr,
        )
        return 2
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    shape = TINY_SHAPE if args.tiny_shape else QWEN3_0_6B_SHAPE
    workload = QUICK if args.tiny_shape else GPU
    if args.num_requests:
        workload = replace(workload, num_requests=args.num_requests)
    engine_options = {
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_cache_memory_gb": args.kv_cache_memory_gb,
        "attention_backend": args.attention_backend,
    }
    with tempfile.TemporaryDirectory(prefix="nanoengine-bench-") as tmp:
        folder = Path(tmp) / ("qwen3-tiny-random" if args.tiny_shape else "qwen3-0.6b-shape-random")
        start = time.perf_counter()
        print(
            f"[bench_gpu] building a random Qwen3 ({'tiny' if args.tiny_shape else '0.6B'} shape) in {folder} ...",
            file=sys.stderr,
            flush=True,
        )
        build_checkpoint(shape, folder, device, dtype)
        build_s = time.perf_counter() - start
        settings = BenchSettings(
            model=str(folder),
            workload=workload,
            device=device,
            dtype=dtype,
            threads=args.threads,
            engine_options=engine_options,
            hf_batch_size=args.hf_batch_size,
            skip_generate_batch=not args.with_generate_batch,
            skip_tracer=not args.with_tracer,
            skip_startup=True,
        )
        report = run_benchmark(settings)
    report["model"] = "random Qwen3, " + ("tiny shape" if args.tiny_shape else "Qwen3-0.6B shape")
    report["model_shape"] = {"model_type": "qwen3", **shape}
    report["checkpoint_build_s"] = round(build_s, 2)
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    try:
        from tracer.bench.report import print_report

        print_report(report)
    except ImportError:  # no rich on this machine: the JSON says it all
        print(json.dumps(report, indent=2, allow_nan=False))
    print(f"[bench_gpu] results written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
