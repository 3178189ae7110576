"""Token text made readable on a terminal or a slide: no raw control characters, no missing
glyphs, no rows of \ufffd (what the tiny model's byte tokens decode to)."""

from __future__ import annotations

import unicodedata
from functools import lru_cache

UNDECODABLE = "\ufffd"  # what a tokenizer decodes part of a UTF-8 character (a byte token) to
VISIBLE = {"\n": "↵", "\t": "⇥"}
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def readable_char(char: str) -> str:
    if char in VISIBLE:
        return VISIBLE[char]
    if unicodedata.category(char) in INVISIBLE_CATEGORIES:
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    return char


@lru_cache(maxsize=4096)
def printable(text: str) -> str:
    """Text as a projector can show it: ↵ newline, ⇥ tab, other control and invisible characters
    as escapes (\\x12, \\u200b), and each run of undecodable bytes (�) as ⟨?⟩."""
    out, undecodable = [], False
    for char in text:
        if char == UNDECODABLE:
            if not undecodable:
                out.append("⟨?⟩")
            undecodable = True
            continue
        undecodable = False
        out.append(readable_char(char))
    return "".join(out)


def token_label(text: str, token_id: int | None = None) -> str:
    """One token's text, readable: a token that decodes to nothing or to undecodable bytes only
    (a byte token of a longer character) is shown by its id, ⟨id 160⟩."""
    if token_id is not None and is_byte_fragment(text):
        return f"⟨id {token_id}⟩"
    return printable(text)


def is_byte_fragment(text: str) -> bool:
    """A token that decodes, on its own, to nothing or to undecodable bytes only: a piece of a
    multi-byte character (Chinese, emoji) whose other bytes come in other tokens."""
    return not text or set(text) == {UNDECODABLE}


def completed_character(token_text: str, output_text: str) -> str:
    """The character a byte-fragment token completed, read off the decoded completion ('' when the
    character is still incomplete, or the token was not a fragment)."""
    if not is_byte_fragment(token_text) or not output_text or output_text.endswith(UNDECODABLE):
        return ""
    return output_text[-1]
