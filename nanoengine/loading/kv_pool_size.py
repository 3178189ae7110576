"""How many KV blocks the pool gets: as many as kv_cache_memory_gb holds, never more than the
machine has free."""

from __future__ import annotations

import psutil
import torch

from nanoengine.block_manager import blocks_needed
from nanoengine.config import EngineConfig
from nanoengine.model import ModelConfig, head_dim_of


def bytes_per_block(config: EngineConfig, hf_config: ModelConfig, dtype: torch.dtype) -> int:
    """K and V of block_size tokens in every layer."""
    per_block = 2 * hf_config.num_hidden_layers * config.block_size * hf_config.num_key_value_heads
    return int(per_block * head_dim_of(hf_config) * dtype.itemsize)


def kv_blocks_that_fit(config: EngineConfig, hf_config: ModelConfig, dtype: torch.dtype) -> int:
    """As many blocks as kv_cache_memory_gb holds, but no more than max_num_seqs full-length
    requests need."""
    by_memory = config.kv_cache_memory_gb * 2**30 / bytes_per_block(config, hf_config, dtype)
    by_need = config.max_num_seqs * blocks_needed(config.max_model_len or 0, config.block_size)
    return max(1, int(min(by_memory, by_need)))  # min first: 1e300 GiB is inf bytes


def check_kv_fits(num_kv_blocks: int, bytes_per_block: int, device: torch.device) -> None:
    """Refuse a KV pool bigger than the free memory before allocating it (the OS would kill us)."""
    need = num_kv_blocks * bytes_per_block
    free = free_memory(device)
    if need > free:
        raise ValueError(
            f"num_kv_blocks={num_kv_blocks} needs {need / 2**30:.1f} GiB of KV cache but only "
            f"{free / 2**30:.1f} GiB of {device.type} memory is free: lower num_kv_blocks "
            "(or leave it unset to size the pool by kv_cache_memory_gb)"
        )


def free_memory(device: torch.device) -> int:
    """Bytes free on the device now (host memory through psutil)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return int(psutil.virtual_memory().available)
