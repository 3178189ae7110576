"""The torch attention backend plans its decode groups (sequences batched by length) itself: once a
step, at the first layer, kept on the step's metadata for every other layer. Its prefill attention
equals plain softmax attention: each query head reads its own KV head, each query the keys up to
its position."""

from __future__ import annotations

import pytest
import torch

import nanoengine.attention as attention
from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams


def test_the_torch_backend_plans_its_decode_groups_once_a_step(monkeypatch: pytest.MonkeyPatch):
    plans: list[list[attention.Decode]] = []
    metas: list[attention.AttentionMetadata] = []
    group_by_length, call = attention.group_by_length, attention.TorchAttention.__call__

    def planning(decodes: list[attention.Decode]) -> list[list[attention.Decode]]:
        plans.append(decodes)
        return group_by_length(decodes)

    def attending(self, q, kv, meta, scale):
        metas.append(meta)
        return call(self, q, kv, meta, scale)

    monkeypatch.setattr(attention, "group_by_length", planning)
    monkeypatch.setattr(attention.TorchAttention, "__call__", attending)
    llm = LLM("tiny", attention_backend="torch", block_size=4)
    prompts = ["the cat sat", "a much longer prompt than the first one, with more blocks", "hi"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0))
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)
    num_steps, num_layers = llm.engine.num_steps, len(llm.engine.model.model.layers)
    assert len(metas) == num_steps * num_layers  # every layer of every step attends here
    assert len(plans) == num_steps  # but plans once a step
    assert sum(map(len, plans)) > 2 * len(prompts)  # (decodes among them)
    for meta in metas[::num_layers]:
        assert meta.decode_groups is not None
        rows = sorted(row for g in meta.decode_groups for row in g.rows.tolist())
        assert rows == sorted(row for _, row, _ in meta.decodes)  # each decode in one group


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Softmax attention in float64 for a chunk of len(q) queries that ends at seq_len, each query
    head reading KV head h // group: q [n, heads, dim], k and v [seq_len, kv_heads, dim]."""
    n, heads, dim = q.shape
    group = heads // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1).transpose(0, 1) for t in (k, v))  # [heads, seq_len, dim]
    scores = q.double().transpose(0, 1) @ k.transpose(1, 2) / dim**0.5  # [heads, n, seq_len]
    sees = torch.arange(seq_len)[None, :] <= torch.arange(seq_len - n, seq_len)[:, None]
    scores = scores.masked_fill(~sees, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).float()


@pytest.mark.parametrize("num_cached", [0, 11])  # a whole prompt (causal), a chunk after 11 cached tokens (mask)
def test_prefill_attention_reads_each_query_heads_own_kv_head(num_cached: int):
    block_size, heads, kv_heads, dim, seq_len = 4, 6, 2, 8, 19
    backend = attention.TorchAttention()
    gen = torch.Generator().manual_seed(num_cached)
    kv = torch.zeros(2, *backend.cache_shape(8, block_size, kv_heads, dim))
    blocks = torch.tensor([5, 2, 7, 0, 3])  # scattered, as the block manager hands them out
    k, v = torch.randn(2, seq_len, kv_heads, dim, generator=gen)
    slots = blocks[torch.arange(seq_len) // block_size] * block_size + torch.arange(seq_len) % block_size
    backend.write_kv(kv, k, v, slots)
    n = seq_len - num_cached
    q = torch.randn(n, heads, dim, generator=gen)
    meta = attention.AttentionMetadata(
        slot_mapping=slots[num_cached:],
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([seq_len], dtype=torch.int32),
        block_tables=blocks[None].int(),
        max_query_len=n,
        max_seq_len=seq_len,
        decodes=[],
        prefills=[(0, 0, n, seq_len)],
    )
    out = backend(q, kv, meta, scale=dim**-0.5)
    assert torch.allclose(out, reference_attention(q, k, v, seq_len), atol=1e-5)
