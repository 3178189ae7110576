"""vLLM's utility endpoints, in vLLM's shapes: /tokenize, /detokenize, /tokenizer_info and /version
(the routes are in app.py; /metrics is metrics.py's).

    POST /tokenize   {"prompt": "Hello"}            -> {"count": 1, "max_model_len": 2048, "tokens": [...],
                     or {"messages": [...]}            "token_strs": null}
    POST /detokenize {"tokens": [9906]}             -> {"prompt": "Hello"}
    GET  /tokenizer_info                            -> {"tokenizer_class": ..., "eos_token": "<|im_end|>",
                                                        "chat_template": ..., "model_max_length": 2048, ...}
    GET  /version                                   -> {"version": "0.1.0"}

/tokenizer_info is what lm-eval's API models look for first: with it (and /tokenize, /detokenize)
they use the server's own tokenizer ("remote") and need no copy of the model's files.

A prompt is tokenized as /v1/completions reads it (no special tokens added unless
add_special_tokens is true); messages as /v1/chat/completions renders them.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from nanoengine.loading.tiny import SPECIAL_TOKENS, ByteTokenizer
from nanoengine.loading.validation import first_line
from tracer.serve.chat import render_chat
from tracer.serve.protocol import DetokenizeRequest, RequestError, TokenizeRequest


def tokenize(body: TokenizeRequest, tokenizer: Any, max_model_len: int) -> dict:
    if body.messages is not None:
        text = render_chat(tokenizer, body.messages, body.add_generation_prompt)
    else:
        text = body.prompt or ""
    try:
        tokens = [int(t) for t in tokenizer.encode(text, add_special_tokens=body.add_special_tokens)]
    except Exception as e:  # a tokenizer that cannot read this text: this request only
        raise RequestError(f"the text could not be tokenized ({first_line(e)})", "prompt") from None
    token_strs = token_strings(tokenizer, tokens) if body.return_token_strs else None
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": token_strs}


def token_strings(tokenizer: Any, tokens: list[int]) -> list[str]:
    """Each token as the vocabulary spells it ('Ġworld'), or decoded alone by a tokenizer without one."""
    if hasattr(tokenizer, "convert_ids_to_tokens"):
        return [str(s) for s in tokenizer.convert_ids_to_tokens(tokens)]
    return [tokenizer.decode([t]) for t in tokens]


def detokenize(body: DetokenizeRequest, tokenizer: Any, vocab_size: int) -> dict:
    for i, t in enumerate(body.tokens):
        if not 0 <= t < vocab_size:
            raise RequestError(f"token {i} is {t}: token ids are integers in [0, {vocab_size})", "tokens")
    return {"prompt": tokenizer.decode(body.tokens, skip_special_tokens=True)}


def tokenizer_info(tokenizer: Any, max_model_len: int) -> dict:
    """The tokenizer's class, special tokens and chat template, as vLLM's /tokenizer_info lists them."""
    info: dict[str, Any] = {"tokenizer_class": type(tokenizer).__name__}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        info[name] = special_token(tokenizer, name)
    info["chat_template"] = getattr(tokenizer, "chat_template", None)
    info["model_max_length"] = max_model_len
    return info


def special_token(tokenizer: Any, name: str) -> str | None:
    """'eos_token' -> its text: from the tokenizer's config, a transformers tokenizer's attribute, or
    the tiny model's byte tokenizer's names."""
    if isinstance(getattr(tokenizer, "special_tokens", None), dict):
        value = tokenizer.special_tokens.get(name)
        return value if isinstance(value, str) else None
    value = getattr(tokenizer, name, None)
    if isinstance(value, str):
        return value
    if isinstance(tokenizer, ByteTokenizer):  # the tiny model's: special tokens by name ('<eos>')
        token = f"<{name.removesuffix('_token')}>"
        return token if token in SPECIAL_TOKENS else None
    return None


def version() -> dict:
    try:
        return {"version": metadata.version("nanoengine")}
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return {"version": "unknown"}
