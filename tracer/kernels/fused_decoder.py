"""The engine's decoder forward with its small steps fused (fused_ops.c): per layer four linears,
the attention backend and three compiled passes, instead of some twenty torch ops. The residual
stream is carried beside the normed activations, as in vLLM, so each residual add happens inside
the norm that follows it. Same weights, same cache, same attention backend as the model it wraps,
and the same bits: a test holds its outputs equal to the model's own forward. A decode step of a
few sequences runs the same loop in one C call (decode_layers.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from nanoengine.attention import AttentionBackend, AttentionMetadata, KVCache
from nanoengine.model import CausalLM, DecoderLayer, Linear, RMSNorm
from tracer.kernels.decode_layers import DecodeLayers
from tracer.kernels.fused_ops import add_rms_norm, cache_fits, rope_write_kv, silu_and_mul
from tracer.kernels.packed_linear import Agreement, MatMul, Shape, few_rows_first
from tracer.kernels.paged_attention import PagedDecodeAttention

# Each linear is called without nn.Module's call machinery (its hook checks cost ~10 us a call, 121
# calls a step, 3 % of a step at batch 1): its bound forward (oneDNN on a packed weight, else
# F.linear), or packed_linear.py's kernel first where it gives the same bits.


@dataclass(slots=True)
class LayerParts:
    """One decoder layer's modules, looked up once (not at every step)."""

    input_norm: RMSNorm
    qkv_proj: MatMul
    o_proj: MatMul
    post_attention_norm: RMSNorm
    gate_up_proj: MatMul
    down_proj: MatMul
    num_heads: int
    scale: float

    def linears(self) -> tuple[MatMul, MatMul, MatMul, MatMul]:
        """The layer's linears in the order of its modules (and of decode_layers.c's layer_t)."""
        return self.qkv_proj, self.o_proj, self.gate_up_proj, self.down_proj

    @staticmethod
    def of(layer: DecoderLayer, agreements: dict[Shape, Agreement]) -> LayerParts:
        attn, mlp = layer.self_attn, layer.mlp
        return LayerParts(
            layer.input_layernorm,
            few_rows_first(attn.qkv_proj, agreements),
            few_rows_first(attn.o_proj, agreements),
            layer.post_attention_layernorm,
            few_rows_first(mlp.gate_up_proj, agreements),
            few_rows_first(mlp.down_proj, agreements),
            attn.num_heads,
            attn.scale,
        )


def check_step(positions: Tensor, slot_mapping: Tensor, max_positions: int, kv: KVCache) -> None:
    """What the compiled steps read without checking, checked once a step: they index the rotary
    tables by position and the cache by slot, as the torch path's indexing would refuse to."""
    if positions.dtype != torch.int64 or slot_mapping.dtype != torch.int64:
        raise TypeError("the fused decoder takes int64 positions and slot_mapping")
    num_slots = kv.shape[1] * kv.shape[3]
    if len(positions) and not (0 <= int(positions.min()) and int(positions.max()) < max_positions):
        raise IndexError(f"a position lies outside the rotary table's 0..{max_positions - 1}")
    if len(slot_mapping) and not (0 <= int(slot_mapping.min()) and int(slot_mapping.max()) < num_slots):
        raise IndexError(f"a slot lies outside the KV cache's 0..{num_slots - 1}")


class FusedDecoder:
    """Called like CausalLM, compute_logits included."""

    def __init__(self, model: CausalLM):
        self.model = model
        self.config = model.config
        agreements: dict[Shape, Agreement] = {}  # one per shape of linear, shared by its layers
        self.layers = [LayerParts.of(cast(DecoderLayer, layer), agreements) for layer in model.model.layers]
        self.lm_head = few_rows_first(cast(Linear, model.lm_head), agreements)
        self.one_call = DecodeLayers(self.layers, self.config.intermediate_size)

    @staticmethod
    def fits(model: CausalLM, device: torch.device, kv_dtype: torch.dtype | None = None) -> bool:
        """Llama and Qwen2 on the CPU in float32 or bfloat16 (Qwen3's q/k norms are not fused), with
        a KV cache the kernels write (fused_ops.cache_fits; None: the model's dtype)."""
        layer = cast(DecoderLayer, model.model.layers[0])
        dtype = layer.input_layernorm.weight.dtype
        return (
            device.type == "cpu"
            and dtype in (torch.float32, torch.bfloat16)
            and cache_fits(dtype, kv_dtype or dtype)
            and not hasattr(layer.self_attn, "q_norm")
        )

    def __call__(self, *inputs: Any) -> Tensor:
        return self.forward(*inputs)  # looked up at each call, so a profiler can wrap forward

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """CausalLM.compute_logits with the final norm as one C call (the model's norm is four torch
        ops in bfloat16) and the LM head called as the layers' linears are."""
        norm = self.model.model.norm
        return self.lm_head(add_rms_norm(None, hidden.contiguous(), norm.weight, norm.eps))

    def linears(self) -> list[MatMul]:
        """Every linear as this decoder calls it, in the model's order (its modules' order)."""
        return [linear for layer in self.layers for linear in layer.linears()] + [self.lm_head]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        attend: AttentionBackend,
    ) -> Tensor:
        decoder = self.model.model
        cos, sin = decoder.rotary_emb.cos, decoder.rotary_emb.sin
        check_step(positions, meta.slot_mapping, len(cos), kv_caches[0])
        residual = decoder.embed_tokens(input_ids)  # [T, hidden]
        if isinstance(attend, PagedDecodeAttention) and self.one_call.fits(len(input_ids), residual, meta):
            self.one_call.run(residual, positions, (cos, sin), kv_caches, meta)  # the loop below, in C
            return residual
        first = self.layers[0].input_norm
        h = add_rms_norm(None, residual, first.weight, first.eps)
        for i, (layer, kv) in enumerate(zip(self.layers, kv_caches)):
            qkv = layer.qkv_proj(h)  # [T, (heads + 2 * kv_heads) * head_dim]
            q = rope_write_kv(qkv, positions, cos, sin, meta.slot_mapping, kv, layer.num_heads)
            o = attend(q, kv, meta, layer.scale)  # [T, heads, head_dim]
            norm = layer.post_attention_norm
            h = add_rms_norm(layer.o_proj(o.flatten(1)), residual, norm.weight, norm.eps)
            down = layer.down_proj(silu_and_mul(layer.gate_up_proj(h)))  # [T, hidden]
            if i + 1 < len(self.layers):
                norm = self.layers[i + 1].input_norm
                h = add_rms_norm(down, residual, norm.weight, norm.eps)
            else:
                residual += down
        return residual
