"""vLLM's utility endpoints, in vLLM's shapes: /tokenize, /detokenize and /version (the routes are
in app.py; /metrics is metrics.py's).

    POST /tokenize   {"prompt": "Hello"}            -> {"count": 1, "max_model_len": 2048, "tokens": [...],
                     or {"messages": [...]}            "token_strs": null}
    POST /detokenize {"tokens": [9906]}             -> {"prompt": "Hello"}
    GET  /version                                   -> {"version": "0.1.0"}

A prompt is tokenized as /v1/completions reads it (no special tokens added unless
add_special_tokens is true); messages as /v1/chat/completions renders them.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from nanoengine.validation import first_line
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


def version() -> dict:
    try:
        return {"version": metadata.version("nanoengine")}
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return {"version": "unknown"}
