"""Text deltas from token ids as they arrive, for streaming.

tokenizers' DecodeStream turns each new token into the text it completes (None while a character
is still split across tokens). A stop string must never reach the client, so the last
(longest stop string - 1) characters are held back until the next token shows they do not start
one. On the last update the engine's own final text (cut at the stop string) decides the rest, so
the streamed deltas add up to exactly what LLM.generate returns.
"""

from __future__ import annotations

from typing import Any


class ByteStream:
    """DecodeStream's contract for a tokenizer without a fast backend (the tiny model's bytes):
    decode everything, hand out what is new once it does not end mid-character."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.num_chars = 0

    def step(self, tokenizer: Any, token_id: int) -> str | None:
        self.ids.append(token_id)
        text = tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return None
        delta, self.num_chars = text[self.num_chars :], len(text)
        return delta or None


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            from tokenizers.decoders import DecodeStream

            self.stream: Any = DecodeStream(skip_special_tokens=True)
            self.tokenizer = backend
        else:
            self.stream, self.tokenizer = ByteStream(), tokenizer
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # everything decoded so far
        self.num_sent = 0  # characters of text already handed out

    def delta(self, new_token_ids: list[int], final_text: str | None = None) -> str:
        """The text to send now for these new tokens; final_text (the engine's) on the last update."""
        for token_id in new_token_ids:
            self.text += self.stream.step(self.tokenizer, token_id) or ""
        if final_text is not None:
            sent = self.text[: self.num_sent]
            rest = final_text[len(sent) :] if final_text.startswith(sent) else ""
            self.num_sent = len(self.text)
            return rest
        ready = max(self.num_sent, len(self.text) - self.holdback)
        out, self.num_sent = self.text[self.num_sent : ready], ready
        return out
