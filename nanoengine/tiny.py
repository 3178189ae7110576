"""A small random-weight Llama for fast tests and demos: no download, same every time."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")


class ByteTokenizer:
    """One token per UTF-8 byte (ids 3..258) after three special tokens."""

    eos_token_id = 2
    chat_template = None
    vocab_size = 256 + len(SPECIAL_TOKENS)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b + len(SPECIAL_TOKENS) for b in text.encode("utf-8")]

    def decode(self, token_ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        data = bytes(t - len(SPECIAL_TOKENS) for t in token_ids if len(SPECIAL_TOKENS) <= t < self.vocab_size)
        return data.decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, token_ids: list[int]) -> list[str]:
        return [SPECIAL_TOKENS[t] if t < len(SPECIAL_TOKENS) else self.decode([t]) for t in token_ids]


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
