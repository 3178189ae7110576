"""A decoder model's arithmetic shape: its linear layers and attention, and the FLOPs a token costs.

The useful-work count of efficiency.py and the bytes of roofline.py are both read from it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def of(cls, config) -> ModelShape:
        from nanoengine.model import head_dim_of

        return cls(
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim_of(config),
            config.intermediate_size,
            config.vocab_size,
        )

    @property
    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer, and the LM head."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
            "lm_head": (h, self.vocab_size),
        }

    def linear_flops(self) -> int:
        """Per token, every decoder layer's linears: 2 FLOPs (multiply + add) per weight."""
        per_layer = sum(a * b for name, (a, b) in self.linear_shapes.items() if name != "lm_head")
        return 2 * per_layer * self.num_layers

    def attention_flops(self, context: int) -> int:
        """Per token attending to `context` keys, all layers: q.k and p.v, 2 FLOPs per multiply-add."""
        return 2 * 2 * self.num_heads * self.head_dim * context * self.num_layers

    def lm_head_flops(self) -> int:
        return 2 * self.hidden_size * self.vocab_size

    def token_flops(self, position: int) -> int:
        """One token at `position` (0-based), without the LM head: it attends to position + 1 keys."""
        return self.linear_flops() + self.attention_flops(position + 1)

    def prefill_flops(self, num_prompt_tokens: int) -> int:
        """A whole prompt, causal: sum over positions of linear + attention (closed form), one LM head."""
        n = num_prompt_tokens
        attention = 2 * 2 * self.num_heads * self.head_dim * self.num_layers * n * (n + 1) // 2
        return n * self.linear_flops() + attention + self.lm_head_flops()
