"""`nanoengine bench --profile`: where nanoengine's time goes, per phase, from torch.profiler.

One more run of the workload on a fresh engine under torch.profiler (CPU activities). The engine
is not changed: the bench wraps its pieces in named profiler ranges from the outside - the decoder
and LM head ("model"), the attention backend's write_kv and attention call ("attention", which
includes gathering K/V through the block tables) and the sampler ("sampling") - and each step
("step"). Inside a step, time is sorted into:

    linear                     the linear layers (q/k/v/o, MLP, LM head): aten::linear, or
                               mkldnn::_linear_pointwise where nanoengine's Linear runs on oneDNN,
                               or the few-row kernel (tracer/kernels/packed_gemv.c)
    attention (incl. K/V gather)  the backend's calls: K/V write, gather, scores, softmax, p.v
    norms / RoPE / activation  every other torch op inside the model (RMSNorm, RoPE, SiLU, residual
                               adds, embedding, reshapes), or the fused kernels that replace
                               them (tracer/kernels/fused_ops.c; RoPE's includes the K/V write)
    sampling                   the sampler
    Python and the rest        the step's wall time not spent in those ops: scheduling, input
                               preparation, bookkeeping, and Python between the model's ops

A step belongs to the prefill-heavy phase up to and including the step that gives the last request
its first token; the decode-heavy phase is the rest (the same split as the efficiency figures).
Profiling adds a few microseconds per op, which lands mostly in "Python and the rest". A decode step
of a few sequences, which the tools run through all the layers in one C call
(tracer/kernels/decode_layers.c), runs the fused decoder's loop here instead: one call cannot be
split into these categories.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.profiler import record_function

from nanoengine.engine import LLMEngine
from tracer.bench.engine import bench_engine, greedy_params, warm_up
from tracer.bench.workload import BenchRequest
from tracer.kernels import fused_ops
from tracer.kernels.decode_layers import DecodeLayers
from tracer.kernels.packed_linear import FewRowsLinear

CATEGORIES = (
    "linear",
    "attention (incl. K/V gather)",
    "norms / RoPE / activation",
    "sampling",
    "Python and the rest",
)
SCOPES = {"linear": CATEGORIES[0], "attention": CATEGORIES[1], "fused": CATEGORIES[2], "sampling": CATEGORIES[3]}
FUSED_STEPS = ("add_rms_norm", "rope_write_kv", "silu_and_mul")  # tracer/kernels/fused_decoder.py
FEW_ROWS_KERNEL = FewRowsLinear.kernel  # called through ctypes: invisible to the profiler unless scoped
ONE_CALL_FITS = DecodeLayers.fits


def never(*args: Any) -> bool:
    return False


def scoped(fn: Callable, name: str) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)

    return wrapper


class ScopedAttention:
    """The engine's attention backend, each call inside an "attention" profiler range."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.cache_shape = inner.cache_shape
        self.write_kv = scoped(inner.write_kv, "attention")

    def __call__(self, *args: Any) -> torch.Tensor:
        with record_function("attention"):
            return self.inner(*args)


def instrument(engine: LLMEngine) -> None:
    import tracer.kernels.fused_decoder as fused_decoder

    runner = engine.runner
    runner.attend = ScopedAttention(runner.attend)  # type: ignore[assignment]
    runner.model.forward = scoped(runner.model.forward, "model")  # type: ignore[method-assign]
    runner.model.compute_logits = scoped(runner.model.compute_logits, "model")  # type: ignore[method-assign]
    runner.sampler = scoped(runner.sampler, "sampling")  # the engine's or the compiled one
    for name in FUSED_STEPS:
        setattr(fused_decoder, name, scoped(getattr(fused_ops, name), "fused"))
    FewRowsLinear.kernel = scoped(FEW_ROWS_KERNEL, "linear")  # type: ignore[method-assign]
    DecodeLayers.fits = never  # type: ignore[method-assign,assignment]
    engine.step = scoped(engine.step, "step")  # type: ignore[method-assign]


def uninstrument() -> None:
    import tracer.kernels.fused_decoder as fused_decoder

    for name in FUSED_STEPS:
        setattr(fused_decoder, name, getattr(fused_ops, name))
    FewRowsLinear.kernel = FEW_ROWS_KERNEL  # type: ignore[method-assign]
    DecodeLayers.fits = ONE_CALL_FITS  # type: ignore[method-assign]


LINEAR_OPS = ("aten::linear", "mkldnn::_linear_pointwise")


def classify(event: Any, in_model: bool, totals: dict[str, float]) -> float:
    """Add the event's CPU time to its category (recursing through ranges); returns the time classified."""
    name = event.name
    if name in SCOPES:
        totals[SCOPES[name]] += event.cpu_time_total
        return event.cpu_time_total
    if name in LINEAR_OPS:
        totals["linear"] += event.cpu_time_total
        return event.cpu_time_total
    if in_model and name.startswith("aten::"):
        totals["norms / RoPE / activation"] += event.cpu_time_total
        return event.cpu_time_total
    return sum(classify(child, in_model or name == "model", totals) for child in event.cpu_children)


def profile_engine(model: str, options: dict, requests: list[BenchRequest], warmup: list[BenchRequest]) -> dict:
    """Run the workload under torch.profiler; per phase, seconds and share of each category."""
    from torch.profiler import ProfilerActivity, profile

    engine, _ = bench_engine(model, options)
    warm_up(engine, warmup)
    instrument(engine)
    try:
        ids = [engine.add_request(list(r.prompt_token_ids), greedy_params(r)) for r in requests]
        waiting_first = set(ids)
        phase_of_step: list[str] = []
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            while engine.has_unfinished():
                gained = engine.step()
                phase_of_step.append("prefill-heavy" if waiting_first else "decode-heavy")
                waiting_first -= {seq.seq_id for seq in gained}
        for seq_id in ids:
            engine.collect(seq_id)
    finally:
        uninstrument()
    steps = [e for e in prof.events() if e.name == "step" and e.cpu_parent is None]
    steps.sort(key=lambda e: e.time_range.start)
    result: dict[str, dict] = {}
    for phase in ("prefill-heavy", "decode-heavy"):
        totals = dict.fromkeys(CATEGORIES, 0.0)
        wall = 0.0
        chosen = [s for s, p in zip(steps, phase_of_step) if p == phase]
        for step in chosen:
            wall += step.time_range.elapsed_us()
            classified = classify(step, False, totals)
            totals["Python and the rest"] += step.time_range.elapsed_us() - classified
        result[phase] = {
            "num_steps": len(chosen),
            "seconds": round(wall / 1e6, 3),
            "categories": {
                name: {"seconds": round(us / 1e6, 6), "share": round(us / wall, 4) if wall else None}
                for name, us in totals.items()
            },
        }
    return result
