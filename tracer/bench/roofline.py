"""The roofline: how fast a phase could possibly run on this machine, from two measured limits.

A phase needs some arithmetic (useful FLOPs, see efficiency.py) and must move some bytes between
memory and the cores. Whichever takes longer at the machine's best rate bounds the phase:

    bound_s = max(useful FLOPs / GEMM peak, bytes that must move / memory bandwidth)

Bytes that must move, at the least, whoever runs the workload:
- the weights (every linear layer and the LM head), read once per engine step. A phase needs at
  least as many steps as the most tokens any one request produced in it (one token per request per
  step), so that many weight reads;
- the KV cache: a prompt's K/V written once and read once; a decoded token's K/V written once, and
  the K/V of its whole context (its own position included) read by attention.

Decode is memory-bound (a step reads ~0.5 GB of fp32 weights to produce a few tokens each); prefill
is compute-bound. Measuring a decode phase against the GEMM peak alone asks it to beat memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tracer.bench.model_shape import ModelShape
from tracer.bench.timing import time_call
from tracer.bench.workload import BenchRequest
from tracer.kernels.huge_pages import empty_in_huge_pages

STREAM_BYTES = 256 * 2**20  # per buffer: triad's three (768 MiB) pass the largest last-level cache seen


@dataclass(frozen=True, slots=True)
class ByteModel:
    """Bytes per engine step for the weights, per key for the KV cache."""

    weight_bytes: int  # every linear weight and the LM head, read once per step
    kv_bytes_per_key: int  # K and V of one token position, all layers

    @classmethod
    def of(cls, shape: ModelShape, itemsize: int, kv_itemsize: int | None = None) -> ByteModel:
        """Weights of `itemsize` bytes a number; the KV cache's of kv_itemsize (None: the same)."""
        per_layer = sum(a * b for name, (a, b) in shape.linear_shapes.items() if name != "lm_head")
        h, vocab = shape.linear_shapes["lm_head"]
        weights = (per_layer * shape.num_layers + h * vocab) * itemsize
        kv = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * (kv_itemsize or itemsize)
        return cls(weights, kv)

    def token_kv_bytes(self, request: BenchRequest) -> list[int]:
        """The KV bytes behind each output token, in the order of efficiency.request_token_flops: the
        first is the prefill (p keys written and read once); token k >= 1 is the forward of position
        p + k - 1 (one key written, p + k keys read)."""
        p = request.num_prompt_tokens
        first = 2 * p * self.kv_bytes_per_key
        return [first] + [(1 + p + k) * self.kv_bytes_per_key for k in range(1, request.max_tokens)]


def bound_seconds(flops: float, nbytes: float, peak_flops: float, bandwidth: float) -> tuple[float, str]:
    """The roofline bound of a phase and which limit sets it."""
    compute, memory = flops / peak_flops, nbytes / bandwidth
    return (memory, "memory") if memory > compute else (compute, "compute")


StreamKernels = dict[str, tuple[Callable[[], object], int]]  # name -> (one call, the bytes it moves)


def stream_kernels(device: torch.device, nbytes: int = STREAM_BYTES) -> StreamKernels:
    """STREAM-like kernels with torch on three buffers that together pass the cache: read (a sum), copy
    (a -> b) and triad (a = b + s * c). On the CPU the buffers lie in 2 MiB pages where the system
    gives them, as the engine's weights do (huge_pages.py): in 4 kB pages a virtual machine's reads
    are bound by its address translation (on the forty-ninth round's VM ~24 GB/s against ~38 for a
    plain read), and the bound would be below what the engine's own reads reach."""
    n = nbytes // 4
    a, b, c = (buffer(n, device).fill_(value) for value in (1.0, 2.0, 0.5))
    return {
        "read": (lambda: a.sum(), 4 * n),
        "copy": (lambda: b.copy_(a), 8 * n),
        "triad": (lambda: torch.add(b, c, alpha=3.0, out=a), 12 * n),
    }


def buffer(n: int, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return empty_in_huge_pages(n, torch.float32)
    return torch.empty(n, device=device, dtype=torch.float32)


def measure_memory_bandwidth(
    device: torch.device, nbytes: int = STREAM_BYTES, kernels: StreamKernels | None = None, min_time: float = 0.5
) -> dict:
    """The stream kernels' rates in GB/s with the threads torch uses now; kernels: buffers kept from an
    earlier call (stream_kernels), for measuring again and again. The bandwidth is the best of them:
    the machine's limit, as the GEMM peak is the best GEMM."""
    kernels = kernels or stream_kernels(device, nbytes)
    rates = {
        name: round(moved / time_call(fn, device, min_time=min_time) / 1e9, 2) for name, (fn, moved) in kernels.items()
    }
    best = max(rates, key=lambda k: rates[k])
    return {
        "gb_s": rates[best],
        "kernel": best,
        "by_kernel": rates,
        "buffer_mib": kernels["read"][1] // 2**20,
        "huge_pages": device.type == "cpu",  # stream_kernels asked for 2 MiB pages
        "threads": torch.get_num_threads(),
    }
