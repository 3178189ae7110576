"""Paged attention backends. KV lives in per-layer caches of shape [num_blocks, block_size, kv_heads, head_dim]."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor      # [T] where each new token's K/V is written
    query_start_loc: torch.Tensor   # [B+1] int32
    seq_lens: torch.Tensor          # [B] int32: cached + scheduled tokens
    block_tables: torch.Tensor      # [B, max_blocks] int32, padded with 0
    max_query_len: int
    max_seq_len: int
    # For the torch backend: decodes (1 query token) batched, prefill chunks one by one.
    decode_rows: torch.Tensor       # token rows of the decode sequences
    decode_seqs: torch.Tensor       # their indices in the batch
    prefills: list[tuple[int, int, int, int]]  # (batch index, first row, num query tokens, seq_len)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)


def torch_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Gather K/V through the block table and attend; works on CPU and CUDA. q: [T, heads, dim]."""
    out = torch.empty_like(q)
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    group = q.shape[1] // num_kv_heads
    if meta.decode_rows.numel():
        tables = meta.block_tables[meta.decode_seqs]
        lens = meta.seq_lens[meta.decode_seqs]
        max_len = int(lens.max())
        tables = tables[:, :(max_len + k_cache.shape[1] - 1) // k_cache.shape[1]]
        k = k_cache[tables].flatten(1, 2)[:, :max_len]            # [B, L, kv_heads, dim]
        v = v_cache[tables].flatten(1, 2)[:, :max_len]
        qd = q[meta.decode_rows].view(-1, num_kv_heads, group, head_dim)
        scores = torch.einsum("bhgd,blhd->bhgl", qd, k) * scale
        pad = torch.arange(max_len, device=q.device)[None, :] >= lens[:, None]
        scores.masked_fill_(pad[:, None, None, :], float("-inf"))
        o = torch.einsum("bhgl,blhd->bhgd", scores.softmax(-1), v)
        out[meta.decode_rows] = o.reshape(-1, q.shape[1], head_dim)
    for i, start, n, seq_len in meta.prefills:
        num_blocks = (seq_len + k_cache.shape[1] - 1) // k_cache.shape[1]
        table = meta.block_tables[i, :num_blocks]
        k = k_cache[table].flatten(0, 1)[:seq_len].transpose(0, 1)   # [kv_heads, L, dim]
        v = v_cache[table].flatten(0, 1)[:seq_len].transpose(0, 1)
        qp = q[start:start + n].transpose(0, 1)                      # [heads, n, dim]
        # Query i sits at position seq_len - n + i and sees keys up to that position.
        mask = None
        if n != seq_len:
            mask = torch.ones(n, seq_len, dtype=torch.bool, device=q.device).tril(seq_len - n)
        o = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask, is_causal=mask is None,
                                           scale=scale, enable_gqa=group > 1)
        out[start:start + n] = o.transpose(0, 1)
    return out


def flash_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """flash-attn's paged varlen kernel (CUDA, needs block_size a multiple of 256)."""
    from flash_attn import flash_attn_varlen_func
    cu_seqlens_k = F.pad(meta.seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
    return flash_attn_varlen_func(q, k_cache, v_cache, meta.query_start_loc, cu_seqlens_k,
                                  meta.max_query_len, meta.max_seq_len, softmax_scale=scale,
                                  causal=True, block_table=meta.block_tables)


def pick_backend(name: str, device: torch.device, block_size: int):
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return torch_attention
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        if name == "flash":
            raise ValueError("attention_backend='flash' needs flash-attn: pip install 'nanoengine[gpu]'")
        return torch_attention
    if block_size % 256:
        if name == "flash":
            raise ValueError(f"flash-attn's paged kernel needs block_size a multiple of 256, got {block_size}")
        return torch_attention
    return flash_attention
