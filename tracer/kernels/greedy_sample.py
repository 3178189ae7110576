"""The engine's sampler with greedy sampling's pick compiled (greedy_sample.c): the same tokens as
nanoengine/sampler.py's `sample` (a test holds the two equal), to which it hands any batch that is
not all greedy and any logits the kernel does not take."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from nanoengine.sampler import sample
from nanoengine.sampling_params import SamplingParams
from tracer.kernels.build import load

SOURCE = Path(__file__).with_name("greedy_sample.c")
I64, PTR, INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


@functools.cache
def greedy_library(source: Path = SOURCE) -> ctypes.CDLL:
    library = load(source)
    library.first_largest_rows.argtypes = [PTR, I64, I64, INT, PTR, INT]
    library.first_largest_rows.restype = None
    return library


def first_largest(logits: Tensor) -> Tensor:
    """Each row's first largest logit's index, -1 for a row holding a NaN. logits: [rows, vocab],
    float32 or bfloat16, contiguous, on the CPU."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    is_bf16 = int(logits.dtype == torch.bfloat16)
    greedy_library().first_largest_rows(
        logits.data_ptr(), rows, vocab, is_bf16, out.data_ptr(), torch.get_num_threads()
    )
    return out


def takes(logits: Tensor) -> bool:
    """Whether the kernel reads these logits as they lie: a contiguous CPU matrix of its types."""
    return (
        logits.device.type == "cpu"
        and logits.dim() == 2
        and logits.shape[1] > 0
        and logits.dtype in (torch.float32, torch.bfloat16)
        and logits.is_contiguous()
    )


def sample_compiled(logits: Tensor, params: list[SamplingParams], num_tokens: list[int]) -> list[int]:
    """`sample`, called the same way (ModelRunner.sampler)."""
    if takes(logits) and all(p.greedy for p in params):
        tokens = first_largest(logits).tolist()
        if min(tokens, default=0) >= 0:  # -1: a row with a NaN
            return tokens
    return sample(logits, params, num_tokens)
