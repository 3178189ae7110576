"""A small random-weight Llama for fast tests and demos: no download, same every time."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")


class ByteTokenizer:
    """One token per UTF-8 byte (ids 3..258) after three special tokens."""

    eos_token_id = 2
    chat_template = None
    vocab_size = 256 + len(SPECIAL_TOKENS)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b + len(SPECIAL_TOKENS) for b in text.encode("utf-8")]

    def decode(self, token_ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        data = bytes(
            t - len(SPECIAL_TOKENS) for t in token_ids if len(SPECIAL_TOKENS) <= t < self.vocab_size
        )
        return data.decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, token_ids: list[int]) -> list[str]:
        special = len(SPECIAL_TOKENS)
        return [SPECIAL_TOKENS[t] if t < special else self.decode([t]) for t in token_ids]


def tiny_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def init_tiny_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights from a generator of their own, so the caller's global RNG is left alone.

    Draws as torch's default init does, module by module, so the weights are the same every time."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            bound = 1 / math.sqrt(module.in_features)
            nn.init.uniform_(module.weight, -bound, bound, generator=generator)
            if module.bias is not None:
                nn.init.uniform_(module.bias, -bound, bound, generator=generator)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, generator=generator)
