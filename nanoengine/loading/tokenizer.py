"""A model folder's tokenizer: tokenizer.json through the `tokenizers` library where that gives
transformers' own ids and text, else transformers' AutoTokenizer."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nanoengine.loading.tiny import ByteTokenizer


def load_tokenizer(path: Path, **kwargs: Any) -> Any:
    files = ("tokenizer.json", "tokenizer_config.json")
    if not kwargs and not any((path / f).exists() for f in files):
        return ByteTokenizer()  # e.g. a tiny test checkpoint saved without a tokenizer
    if not kwargs and (path / files[0]).exists():
        config = json.loads((path / files[1]).read_bytes()) if (path / files[1]).exists() else {}
        if not config.get("clean_up_tokenization_spaces"):  # transformers' decode tidies spaces
            return Tokenizer(path, config)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False, **kwargs)


class Tokenizer:
    """A tokenizer.json read with the `tokenizers` library as transformers' fast tokenizer reads it
    (the same ids, text and chat prompts) without importing transformers, which took most of a
    second of start-up (docs/benchmarks.md)."""

    def __init__(self, path: Path, config: dict[str, Any]):
        from tokenizers import Tokenizer as Backend

        self.backend_tokenizer = Backend.from_file(str(path / "tokenizer.json"))
        file = path / "chat_template.jinja"
        self.chat_template = file.read_text() if file.exists() else config.get("chat_template")
        tokens = {k: v.get("content") if isinstance(v, dict) else v for k, v in config.items()}
        self.special_tokens = {k: v for k, v in tokens.items() if k.endswith("_token")}
        self.eos_token_id = self.backend_tokenizer.token_to_id(tokens.get("eos_token") or "")
        self.vocab_size = self.backend_tokenizer.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode([*token_ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, chat: Any, tokenize: bool, add_generation_prompt: bool) -> str:
        """As transformers renders a chat without tools: sandboxed jinja2 with its options."""
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.add_extension("jinja2.ext.loopcontrols")
        context = dict(messages=chat, add_generation_prompt=add_generation_prompt)
        return env.from_string(self.chat_template or "").render(**context, **self.special_tokens)
