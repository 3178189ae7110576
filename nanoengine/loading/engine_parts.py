"""Everything the engine needs before its first step: the checkpoint, the tokenizer, the model on
its device, and the KV pool's size.

    load_engine_parts(config) -> EngineParts    (fills in config.max_model_len and num_kv_blocks)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

import torch

from nanoengine.attention import AttentionBackend, FlashAttention, TorchAttention
from nanoengine.config import EngineConfig
from nanoengine.loading.build import build_model, eos_ids, pack_for_onednn
from nanoengine.loading.checkpoint import load_model
from nanoengine.loading.kv_pool_size import bytes_per_block, check_kv_fits, kv_blocks_that_fit
from nanoengine.model import CausalLM


@dataclass(slots=True)
class EngineParts:
    model_name: str
    model: CausalLM
    tokenizer: Any
    eos_token_ids: frozenset[int]
    device: torch.device
    kv_dtype: torch.dtype  # the KV pool's numbers: the model's dtype unless kv_cache_dtype says


def load_engine_parts(config: EngineConfig) -> EngineParts:
    """Load the model named by config.model, and decide the knobs config left None from the
    model and the machine; torch's thread count too (num_threads, or the idle cores)."""
    torch.set_num_threads(config.num_threads or idle_cores())
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = choose_dtype(config.dtype, device)
    kv = config.kv_cache_dtype  # vLLM's option: auto keeps the model's dtype
    kv_dtype = dtype if kv == "auto" else choose_dtype(kv, device, "kv_cache_dtype")
    loaded = load_model(config.model)
    hf_config = loaded.config
    config.max_model_len = min(config.max_model_len or 4096, hf_config.max_position_embeddings)
    config.num_kv_blocks = config.num_kv_blocks or kv_blocks_that_fit(config, hf_config, kv_dtype)
    check_kv_fits(config.num_kv_blocks, bytes_per_block(config, hf_config, kv_dtype), device)
    model = build_model(hf_config, loaded.state_dict, config.max_model_len, device, dtype)
    pack_for_onednn(model)
    eos = eos_ids(hf_config, loaded.tokenizer)
    return EngineParts(loaded.name, model, loaded.tokenizer, eos, device, kv_dtype)


DTYPES = ("float32", "bfloat16", "float16")


def choose_dtype(name: str | None, device: torch.device, what: str = "dtype") -> torch.dtype:
    """The dtype asked for; None: float32 on CPU, bfloat16 on CUDA; "auto": bfloat16 also on a CPU
    with bf16 instructions (AVX512_BF16 or AMX), where oneDNN's bf16 kernels beat float32. Without
    them bf16 is emulated: its linears at 32 rows took 4x float32's time (docs/benchmarks.md)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" or cpu_has_bf16() else torch.float32
    if name is not None and name not in DTYPES:
        raise ValueError(f"{what} must be one of {', '.join(DTYPES)} or auto, got {name!r}")
    default = "bfloat16" if device.type == "cuda" else "float32"
    return cast(torch.dtype, getattr(torch, name or default))


def cpu_has_bf16() -> bool:
    """AVX512_BF16 or AMX, as torch's CPU feature check (cpuinfo) reports them."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def idle_cores() -> int:
    """torch threads when not given: the cores others leave idle (at least 1, at most torch's
    own choice).

    On a busy machine OpenMP threads wait for descheduled peers (docs/benchmarks.md)."""
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(torch.get_num_threads(), round((os.cpu_count() or 1) - busy)))


def pick_backend(name: Any, device: torch.device, block_size: int) -> AttentionBackend:
    """The backend asked for (a name, or the backend itself); auto: flash-attn where it runs, else
    pure torch."""
    if not isinstance(name, str):
        return cast(AttentionBackend, name)
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchAttention()
    problem = ""
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        problem = "attention_backend='flash' needs flash-attn: pip install 'nanoengine[gpu]'"
    if not problem and block_size % 256:
        problem = f"flash-attn's paged kernel needs block_size a multiple of 256, got {block_size}"
    if problem and name == "flash":
        raise ValueError(problem)
    return TorchAttention() if problem else FlashAttention()
