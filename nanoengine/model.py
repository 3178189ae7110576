"""One decoder for the Llama family: Llama / SmolLM2, Qwen2 (qkv bias), Qwen3 (q/k RMSNorm).

Module names mirror Hugging Face's, except that q, k, v_proj are one qkv_proj and gate, up_proj
one gate_up_proj (as in vLLM: one matmul instead of three, or two): STACKED says how a checkpoint's
weights are stacked into them.
Tokens arrive flat ([num_tokens, hidden]): no batch dimension, no padding.
"""

from __future__ import annotations

import platform
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nanoengine.attention import AttentionBackend, AttentionMetadata, KVCache

ModelConfig = Any  # a transformers PretrainedConfig of the Llama family
Rope = tuple[Tensor, Tensor]  # cos, sin

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

X86 = platform.machine().lower() in ("x86_64", "amd64")
ONEDNN = X86 and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class Linear(nn.Linear):
    """nn.Linear whose CPU matmul runs on oneDNN once loading/build.py: pack_for_onednn has laid
    its weight out in oneDNN's blocked layout (x86 builds of torch have oneDNN).

    torch's default BLAS, MKL, does the same sums but takes a slow path on AMD CPUs, and reads a
    single row's weights at half the speed (docs/benchmarks.md)."""

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One fused op, bit for bit HF's float32 result; other dtypes keep HF's order
        (float32 norm, cast, scale)."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        inv_freq = rope_inv_freq(config)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos: Tensor
        self.sin: Tensor
        self.register_buffer("cos", emb.cos(), persistent=False)
        # sin with its first half negated: x.roll(half) * this = HF's rotate_half(x) * sin, in
        # fewer ops
        sin = freqs.sin()
        self.register_buffer("sin", torch.cat((-sin, sin), dim=-1), persistent=False)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> Rope:
        """cos and sin for this step's positions, [T, 1, dim] (broadcast over heads)."""
        cos = self.cos[positions].unsqueeze(1).to(dtype)
        sin = self.sin[positions].unsqueeze(1).to(dtype)
        return cos, sin


def apply_rope(x: Tensor, rope: Rope) -> Tensor:
    """Rotates each pair (x[i], x[i + half]) of every head by its position's angle."""
    cos, sin = rope
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def rope_inv_freq(config: ModelConfig) -> Tensor:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        dim = head_dim_of(config)
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, _ = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return torch.as_tensor(inv_freq).float()


def head_dim_of(config: ModelConfig) -> int:
    head_dim = getattr(config, "head_dim", None)
    return int(head_dim or config.hidden_size // config.num_attention_heads)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        self.scale = self.head_dim**-0.5
        bias = getattr(config, "attention_bias", config.model_type == "qwen2")
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.heads = [self.num_heads, self.num_kv_heads]
        # HF's q_proj, k_proj and v_proj, stacked
        self.qkv_proj = Linear(config.hidden_size, q_size + 2 * kv_size, bias=bias)
        self.o_proj = Linear(q_size, config.hidden_size, bias=False)
        if config.model_type == "qwen3":
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self, x: Tensor, rope: Rope, kv: KVCache, meta: AttentionMetadata, attend: AttentionBackend
    ) -> Tensor:
        qkv = self.qkv_proj(x).unflatten(-1, (-1, self.head_dim))  # [T, all heads, head_dim]
        qk, v = qkv.split([self.num_heads + self.num_kv_heads, self.num_kv_heads], 1)
        if hasattr(self, "q_norm"):
            q, k = qk.split(self.heads, 1)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), 1)
        q, k = torch.split(apply_rope(qk, rope), self.heads, 1)  # rotated together: half the ops
        attend.write_kv(kv, k, v, meta.slot_mapping)
        o = attend(q, kv, meta, self.scale)
        return self.o_proj(o.flatten(1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        # HF's gate_proj and up_proj, stacked
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: Tensor, rope: Rope, kv: KVCache, meta: AttentionMetadata, attend: AttentionBackend
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv, meta, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config, max_positions)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, max_positions)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        attend: AttentionBackend,
    ) -> Tensor:
        x: Tensor = self.model.embed_tokens(input_ids)
        rope = self.model.rotary_emb(positions, x.dtype)
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x = layer(x, rope, kv_cache, meta, attend)
        return x

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """Final norm + LM head, only for the rows that are sampled (the norm is per token)."""
        return self.lm_head(self.model.norm(hidden))
