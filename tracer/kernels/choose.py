"""Which compiled kernels the tools hand the engine: on a CPU run, `auto` takes the paged-decode
kernel, the fused small steps, the few-row linears (bfloat16 ones where AMX or AVX512_BF16 runs),
the one-call decode step and greedy sampling's pick where this machine can build them, and the
engine's own torch path where not."""

from __future__ import annotations

import torch

from nanoengine.engine import LLMEngine
from tracer.kernels import KERNEL, kv_cache_words
from tracer.kernels.build import KernelUnavailable
from tracer.kernels.decode_layers import decode_layers_library
from tracer.kernels.fused_decoder import FusedDecoder
from tracer.kernels.fused_ops import fused_ops_library
from tracer.kernels.greedy_sample import greedy_library, sample_compiled
from tracer.kernels.huge_pages import MOVE_AT_BUILD_S, mark_for_huge_pages, move_weights
from tracer.kernels.packed_linear import amx_gemv_library, dpbf16_gemv_library, packed_gemv_library
from tracer.kernels.paged_attention import PagedDecodeAttention


def runs_on_cpu(options: dict) -> bool:
    device = options.get("device")
    return device == "cpu" or (device is None and not torch.cuda.is_available())


def with_attention_kernel(options: dict) -> dict:
    """Engine options with attention_backend settled: auto (or unset) on the CPU becomes the
    compiled backend where it builds; cpu-kernel insists on it (one line saying why it cannot);
    torch and flash go to the engine as they are."""
    choice = options.get("attention_backend") or "auto"
    if choice not in ("auto", KERNEL):
        return options
    try:
        if not runs_on_cpu(options):
            raise KernelUnavailable(f"it runs on the CPU only; this run is on {options['device']}")
        fused_ops_library()  # every library builds, or none is used
        packed_gemv_library()
        amx_gemv_library()  # on every CPU; used where AMX runs
        dpbf16_gemv_library()  # on every CPU; used where AVX512_BF16 runs without AMX
        decode_layers_library()
        greedy_library()
        return {**options, "attention_backend": PagedDecodeAttention()}
    except KernelUnavailable as error:
        if choice == KERNEL:
            raise ValueError(f"attention_backend {KERNEL}: {error}") from None
        return {**options, "attention_backend": "auto"}


def build_engine(model: str, options: dict, move_seconds: float = MOVE_AT_BUILD_S) -> LLMEngine:
    """The engine the tools run: with_attention_kernel's backend and, with the kernel, the
    decoder's small steps fused (FusedDecoder, where the model fits it) and greedy sampling's pick
    compiled, and on the CPU the weights in huge pages: marked, and moved there for up to
    move_seconds (huge_pages.py; the bench's engine moves all: bench/engine.py, bench_engine)."""
    engine = LLMEngine(model, **with_attention_kernel(options))
    if engine.device.type == "cpu":
        mark_for_huge_pages(engine.model.modules())
        move_weights(engine.model.modules(), move_seconds)
    fused = isinstance(engine.runner.attend, PagedDecodeAttention)
    if fused:
        engine.runner.sampler = sample_compiled
    if fused and FusedDecoder.fits(engine.model, engine.device, engine.runner.kv_caches[0].dtype):
        engine.runner.model = FusedDecoder(engine.model)  # type: ignore[assignment]
    return engine


def attention_in_use(options: dict) -> str:
    """What the tools run for these options, in words, for a report's header (with the KV cache's
    dtype where it is not the model's)."""
    backend = with_attention_kernel(options).get("attention_backend") or "auto"
    if isinstance(backend, PagedDecodeAttention):
        what = f"attention {KERNEL} (compiled paged decode; fused norms, RoPE, SiLU; few-row linears)"
    elif backend == "auto":
        what = "attention torch" if runs_on_cpu(options) else "attention auto (flash-attn where it runs)"
    else:
        what = f"attention {backend}"
    return what + kv_cache_words(options.get("kv_cache_dtype"))
