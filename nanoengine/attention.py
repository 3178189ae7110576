"""Paged attention backends. Each owns its KV-cache layout, the block axis first in all:
[2 (K, V), num_kv_blocks, ...]; all address K/V by slot: slot = block * block_size + offset."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

KVCache = Tensor  # one layer's K and V caches, [2, ...] in the backend's own layout
Decode = tuple[int, int, int]  # a sequence with 1 query token: (batch index, row, seq_len)


@dataclass(slots=True)
class DecodeGroup:
    """Decode sequences of similar length, batched: K/V is padded only to the group's longest."""

    rows: torch.Tensor  # their token rows in the flat batch
    block_ids: torch.Tensor  # their block tables, cut to the group's longest sequence, flattened
    pad: torch.Tensor  # [num_seqs, num_blocks * block_size]: True past each sequence's length


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32: cached + scheduled tokens
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    max_query_len: int
    max_seq_len: int
    # On the CPU, for backends that plan from them: decodes (1 query token) and prefill chunks
    decodes: list[Decode]
    prefills: list[tuple[int, int, int, int]]  # (batch index, first row, num query tokens, seq_len)
    # The torch backend's plan: decodes batched by length, made at the step's first layer (every
    # layer gets the step's one metadata), not by the runner: a step that a faster kernel runs
    # without this backend never pays for it.
    decode_groups: list[DecodeGroup] | None = None


def group_by_length(
    decodes: list[Decode], min_group: int = 8, max_groups: int = 4
) -> list[list[Decode]]:
    """Split decode sequences, sorted by length, into a few groups: less K/V padding to gather."""
    decodes = sorted(decodes, key=lambda d: d[2])
    num_groups = max(1, min(max_groups, len(decodes) // min_group))
    cuts = [len(decodes) * g // num_groups for g in range(num_groups + 1)]
    return [decodes[start:end] for start, end in zip(cuts, cuts[1:]) if start < end]


def decode_group(decodes: list[Decode], block_tables: Tensor, block_size: int) -> DecodeGroup:
    """One group's rows, block tables and padding, on block_tables' device."""
    seqs, rows, lens = zip(*decodes)
    num_blocks = (max(lens) + block_size - 1) // block_size
    pad = torch.arange(num_blocks * block_size)[None, :] >= torch.tensor(lens)[:, None]
    block_ids = block_tables[list(seqs), :num_blocks].flatten()
    return DecodeGroup(block_tables.new_tensor(rows), block_ids, pad.to(block_ids.device))


class TorchAttention:
    """Pure torch, CPU and CUDA. Cache [2 (K, V), num_kv_blocks, kv_heads, block_size, dim]: block,
    head, row, in vLLM's CPU backend's order (which also puts each row's K and V side by side): a
    block's bytes lie together, each KV head's rows in one run. Seen with its block and head axes
    swapped, one index_select gathers a sequence's blocks of K and V laid out for batched matmuls.
    """

    def cache_shape(
        self, num_kv_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        return (num_kv_blocks, num_kv_heads, block_size, head_dim)

    def write_kv(self, kv: KVCache, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
        k_cache, v_cache = kv
        blocks, rows = slot_mapping // kv.shape[3], slot_mapping % kv.shape[3]
        k_cache[blocks, :, rows] = k.to(kv.dtype)  # [T, kv_heads, dim]: into its block's row
        v_cache[blocks, :, rows] = v.to(kv.dtype)  # (rounded where kv_cache_dtype is narrower)

    def __call__(self, q: Tensor, kv: KVCache, meta: AttentionMetadata, scale: float) -> Tensor:
        """q: [T, heads, dim] -> [T, heads, dim]."""
        out = torch.empty_like(q)
        _, _, num_kv_heads, block_size, dim = kv.shape
        group = q.shape[1] // num_kv_heads  # query heads per KV head
        by_head = kv.transpose(1, 2)  # [2, kv_heads, num_kv_blocks, block_size, dim], a view
        if meta.decode_groups is None:
            groups = group_by_length(meta.decodes)
            meta.decode_groups = [decode_group(g, meta.block_tables, block_size) for g in groups]
        for g in meta.decode_groups:
            B, L = g.pad.shape
            k, v = by_head.index_select(2, g.block_ids).to(q.dtype).view(2, num_kv_heads, B, L, dim)
            # [kv_heads, B, group, dim]: each KV head's query heads side by side
            qd = q[g.rows].view(B, num_kv_heads, group, dim).transpose(0, 1)
            scores = (qd * scale) @ k.transpose(-1, -2)
            scores.masked_fill_(g.pad[None, :, None, :], float("-inf"))
            out[g.rows] = (scores.softmax(-1) @ v).transpose(0, 1).reshape(B, -1, dim)
        for i, start, n, seq_len in meta.prefills:
            table = meta.block_tables[i, : (seq_len + block_size - 1) // block_size]
            k, v = by_head.index_select(2, table).to(q.dtype).flatten(2, 3)[:, :, :seq_len]
            # Query j sits at position seq_len - n + j and sees keys up to that position.
            # A chunk that starts at 0 is plain causal attention: no mask needed.
            mask = None
            if n != seq_len:
                mask = torch.ones(n, seq_len, dtype=torch.bool, device=q.device).tril(seq_len - n)
            # Each KV head repeated for its query heads, all [1, heads, tokens, dim]: torch's fused
            # CPU kernel (3-D inputs or enable_gqa fall back to its 2x slower matmul path).
            k, v = k.repeat_interleave(group, 0)[None], v.repeat_interleave(group, 0)[None]
            q_chunk = q[None, start : start + n].transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q_chunk, k, v, attn_mask=mask, is_causal=mask is None, scale=scale
            )
            out[start : start + n] = o[0].transpose(0, 1)
        return out


class FlashAttention:
    """flash-attn's paged varlen kernel (CUDA; block_size a multiple of 256).

    Cache [num_kv_blocks, block_size, kv_heads, dim]."""

    def cache_shape(
        self, num_kv_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        return (num_kv_blocks, block_size, num_kv_heads, head_dim)

    def write_kv(self, kv: KVCache, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
        k_cache, v_cache = kv
        k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k.to(kv.dtype))
        v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v.to(kv.dtype))

    def __call__(self, q: Tensor, kv: KVCache, meta: AttentionMetadata, scale: float) -> Tensor:
        from flash_attn import flash_attn_varlen_func

        cu_seqlens_k = F.pad(meta.seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
        lens = (meta.query_start_loc, cu_seqlens_k, meta.max_query_len, meta.max_seq_len)
        return flash_attn_varlen_func(
            q, *kv, *lens, softmax_scale=scale, causal=True, block_table=meta.block_tables
        )


AttentionBackend = TorchAttention | FlashAttention
