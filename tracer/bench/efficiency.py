"""How close each system runs to the machine: useful model FLOP/s against the GEMM peak.

Useful FLOPs are the arithmetic the workload needs, whoever computes it: for every token, each
linear layer once (2 FLOPs per weight), attention over the token's real context (no padding, no
recomputation) and the LM head only where a token is sampled (each request's last prompt token and
each decoded token). Padding, decoding past a request's max_tokens and gathering K/V are not
useful work, so a system that does them runs at a lower efficiency.

The peak is the best matmul rate in the run's dtype (float32 on CPU; the bfloat16 row beside it gets
its own, in bfloat16) measured in the same process, at the model's largest linear shapes. A run's time splits in two phases at the moment the last request gets its
first token (every request arrives at t = 0): before it the prefill-heavy phase (all prompt work, plus
the decodes that ran beside it), after it the decode-heavy phase. The decode phase is split once more
where fewer than 16 requests still run: that is the "decode at batch >= 16" window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from tracer.bench.model_shape import ModelShape
from tracer.bench.roofline import ByteModel, bound_seconds
from tracer.bench.timing import other_reads, time_call
from tracer.bench.workload import BenchRequest

FULL_BATCH = 16  # "decode at batch >= 16": while at least this many requests still run
FULL_DECODE = f"decode at batch >= {FULL_BATCH}"  # that phase's name (issue 39 judges decode by it)
PEAK_BATCHES = (32, 128, 512)
CEILING_BATCHES = (FULL_BATCH, 24, 32)  # the decode ceiling's rows: across FULL_DECODE's batches


def request_token_flops(shape: ModelShape, request: BenchRequest) -> list[int]:
    """The useful FLOPs behind each output token: the first is the prompt's prefill; token k >= 1 is
    the forward of token k - 1 at position prompt + k - 1, plus its LM head."""
    p = request.num_prompt_tokens
    flops = [shape.prefill_flops(p)]
    flops += [shape.token_flops(p + k - 1) + shape.lm_head_flops() for k in range(1, request.max_tokens)]
    return flops


@dataclass(slots=True)
class Phase:
    name: str
    start_s: float
    end_s: float
    flops: float = 0.0
    kv_bytes: float = 0.0
    min_steps: int = 0  # at least the most tokens one request produced in the phase
    step_rows: Counter[int] = field(default_factory=Counter)  # rows a step: how many steps had them

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s

    def holds(self, t: float) -> bool:
        """(start, end]; a phase starting at t0 also holds a token at t0."""
        return (t > self.start_s or self.start_s == 0.0) and t <= self.end_s

    def to_dict(self, peak_flops: float, roofline: Roofline | None = None) -> dict:
        rate = self.flops / self.seconds if self.seconds > 0 else None
        result: dict[str, object] = {
            "start_s": round(self.start_s, 3),
            "seconds": round(self.seconds, 3),
            "gflop": round(self.flops / 1e9, 2),
            "gflop_s": None if rate is None else round(rate / 1e9, 2),
            "efficiency": None if rate is None else round(rate / peak_flops, 4),
        }
        if self.step_rows:
            result["step_rows"] = {str(rows): n for rows, n in sorted(self.step_rows.items())}
        if roofline is not None:
            nbytes = self.kv_bytes + self.min_steps * roofline.bytes.weight_bytes
            bound, limit = bound_seconds(self.flops, nbytes, peak_flops, roofline.bandwidth)
            result["gbytes"] = round(nbytes / 1e9, 3)
            result["min_steps"] = self.min_steps
            result["bound_s"] = round(bound, 3)
            result["bound_by"] = limit
            result["of_roofline"] = round(bound / self.seconds, 4) if self.seconds > 0 else None
        return result


@dataclass(frozen=True, slots=True)
class Roofline:
    bandwidth: float  # bytes/s, measured
    bytes: ByteModel


def split_phases(token_times: list[list[float]], elapsed: float) -> list[Phase]:
    """token_times: seconds from t0, per request. The whole run, the prefill-heavy phase (until the
    last first token), the decode-heavy phase and its batch >= FULL_BATCH window."""
    first_tokens = [times[0] for times in token_times if times]
    prefill_end = max(first_tokens, default=elapsed)
    # the moment fewer than FULL_BATCH requests remain: the FULL_BATCH-th latest finish
    finishes = sorted((times[-1] for times in token_times if times), reverse=True)
    full_end = max(prefill_end, finishes[FULL_BATCH - 1]) if len(finishes) >= FULL_BATCH else prefill_end
    return [
        Phase("whole run", 0.0, elapsed),
        Phase("prefill-heavy", 0.0, prefill_end),
        Phase("decode-heavy", prefill_end, elapsed),
        Phase(FULL_DECODE, prefill_end, full_end),
    ]


def run_efficiency(
    shape: ModelShape,
    requests: list[BenchRequest],
    token_times: list[list[float]],
    elapsed: float,
    peak: float,
    cpu_time: float | None = None,
    threads: int = 1,
    roofline: Roofline | None = None,
    steps_stamped: bool = False,
) -> dict:
    """Useful FLOP/s and its fraction of the peak, per phase; a token's FLOPs count where it appears.
    With the run's CPU time, the whole run also per CPU second: on a shared machine the wall clock
    includes time the process waited for a core, the CPU time does not. steps_stamped: every token of
    a step has the step's one timestamp (nanoengine's runs), so FULL_DECODE's steps and their rows
    can be counted (step_rows): after the last first token every step decodes all it runs."""
    phases = split_phases(token_times, elapsed)
    for request, times in zip(requests, token_times):
        kv = roofline.bytes.token_kv_bytes(request) if roofline else [0] * len(times)
        for phase in phases:
            in_phase = [(f, b) for f, b, t in zip(request_token_flops(shape, request), kv, times) if phase.holds(t)]
            phase.flops += sum(f for f, _ in in_phase)
            phase.kv_bytes += sum(b for _, b in in_phase)
            phase.min_steps = max(phase.min_steps, len(in_phase))
    if steps_stamped:
        full = next(phase for phase in phases if phase.name == FULL_DECODE)
        steps = Counter(t for times in token_times for t in times if full.holds(t))
        full.step_rows = Counter(steps.values())
    result = {phase.name: phase.to_dict(peak, roofline) for phase in phases}
    if cpu_time:
        # the peak is for `threads` threads: one CPU second is worth peak / threads
        result["whole run"]["cpu_share"] = round(cpu_time / elapsed / threads, 4)
        result["whole run"]["efficiency_per_cpu_s"] = round(phases[0].flops / cpu_time / (peak / threads), 4)
    return result


# ---- the machine's limit ---------------------------------------------------------------------------
def gemm_libraries(device: torch.device, dtype: torch.dtype) -> dict[str, Callable[[Tensor, Tensor], Tensor]]:
    """y = x @ W.T by each GEMM library torch can reach here: its default (F.linear: MKL on x86 CPUs,
    cuBLAS on CUDA) and, on CPU, oneDNN where nanoengine's Linear uses it: float32, and bfloat16
    where oneDNN has bf16 kernels (loading/build.py: pack_for_onednn)."""
    libraries: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"torch default": F.linear}
    if device.type == "cpu" and dtype in onednn_dtypes():
        libraries["oneDNN"] = lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    return libraries


def onednn_dtypes() -> tuple[torch.dtype, ...]:
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return ()
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)


def measure_gemm_peak(shape: ModelShape, device: torch.device, dtype: torch.dtype) -> dict:
    """GFLOP/s of x @ W.T at the largest decoder-layer linear and at the LM head, for batches of
    PEAK_BATCHES rows, by every GEMM library available; the peak is the best of them all (the
    machine's limit as this process sees it), whichever library reaches it."""
    (h, i), vocab = shape.linear_shapes["gate_proj"], shape.vocab_size
    rates: dict[str, dict[str, dict[int, float]]] = {}
    for library, gemm in gemm_libraries(device, dtype).items():
        rates[library] = {}
        for name, (k, n) in (("gate_proj", (h, i)), ("lm_head", (h, vocab))):
            w = torch.randn(n, k, device=device, dtype=dtype)
            rates[library][name] = {}
            for m in PEAK_BATCHES:
                x = torch.randn(m, k, device=device, dtype=dtype)
                rates[library][name][m] = 2 * m * k * n / time_call(partial(gemm, x, w), device) / 1e9
    cells = [(lib, name, m) for lib in rates for name in rates[lib] for m in rates[lib][name]]
    best_lib, best_name, best_batch = max(cells, key=lambda c: rates[c[0]][c[1]][c[2]])
    return {
        "gflop_s": round(rates[best_lib][best_name][best_batch], 2),
        "library": best_lib,
        "shape": best_name,
        "batch": best_batch,
        "at_batch_32": {name: round(max(r[name][32] for r in rates.values()), 2) for name in rates[best_lib]},
        "by_library": {
            lib: {name: {str(m): round(v, 2) for m, v in r.items()} for name, r in by_name.items()}
            for lib, by_name in rates.items()
        },
        "threads": torch.get_num_threads(),
    }


def measure_linear_ceiling(
    model: torch.nn.Module,
    kernels: list[Callable[[Tensor], Tensor]] | None = None,
    batches: tuple[int, ...] = CEILING_BATCHES,
    between_bytes: int = 0,
) -> dict[str, float]:
    """GFLOP/s of the model's own linear layers (every decoder layer's, then the LM head), called in
    model order on `rows` rows as a decode step calls them, so each weight comes from memory, not
    cache. No decode step of that batch can run faster than its linears alone: this rate, against
    the GEMM peak, bounds the decode efficiency a system can reach on this machine. `kernels`: the
    same linears as the engine runs them, where it has faster ones (the few-row kernels of
    tracer/kernels): the ceiling is the faster way at each batch. `between_bytes`: other memory read
    between two calls, untimed, as a step reads its K/V between two reads of a weight (other_reads)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    modules: list[Callable[[Tensor], Tensor]] = list(linears)
    ways = [modules] + ([kernels] if kernels else [])
    weight = linears[0].weight
    flops_per_row = 2 * sum(m.weight.numel() for m in linears)
    rates = {}
    between = other_reads(between_bytes) if between_bytes and weight.device.type == "cpu" else None
    for rows in batches:
        xs = {
            k: torch.randn(rows, k, device=weight.device, dtype=weight.dtype) for k in {m.in_features for m in linears}
        }
        inputs = [xs[m.in_features] for m in linears]
        seconds = min(
            time_call(partial(run_linears, way, inputs), weight.device, min_time=0.5, between=between) for way in ways
        )
        rates[str(rows)] = round(flops_per_row * rows / seconds / 1e9, 2)
    return rates


@torch.inference_mode()
def run_linears(linears: list[Callable[[Tensor], Tensor]], inputs: list[Tensor]) -> None:
    for linear, x in zip(linears, inputs):
        linear(x)


def model_flops_summary(shape: ModelShape) -> dict:
    return {
        **asdict(shape),
        "linear_mflop_per_token": round(shape.linear_flops() / 1e6, 2),
        "attention_kflop_per_key": round(shape.attention_flops(1) / 1e3, 2),
        "lm_head_mflop": round(shape.lm_head_flops() / 1e6, 2),
    }
