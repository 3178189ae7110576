"""Owner colours, letters and state symbols shared by every replay view.

Colour is never the only cue: each sequence also has a letter (A, B, C, ...) and each state a
symbol, so the views stay readable in monochrome and on a washed-out projector.
"""

from __future__ import annotations

import string
from functools import lru_cache

from rich.style import Style

from nanoengine.sequence import EventKind

LETTERS = string.ascii_uppercase + string.ascii_lowercase + string.digits

# Strong, mutually distinct colours that read on dark and light backgrounds.
PALETTE = (
    "#4ea1ff",
    "#ff9f1c",
    "#2ec4b6",
    "#e84393",
    "#a3d930",
    "#b388ff",
    "#ffd23f",
    "#ff6b6b",
    "#00b4d8",
    "#f4a261",
    "#90be6d",
    "#c77dff",
)

STATE_SYMBOLS = {"WAITING": "◷", "RUNNING": "▶", "FINISHED": "✓"}
STATE_COLORS = {"WAITING": "#ffd23f", "RUNNING": "#2ec4b6", "FINISHED": "#a0a0a0"}

EVENT_MARKS = {
    EventKind.PREEMPTED: ("P", "bold #ff6b6b"),
    EventKind.FINISHED: ("F", "bold #90be6d"),
    EventKind.PREFIX_HIT: ("H", "bold #00b4d8"),
    "violation": ("!", "bold white on #c0392b"),
}

FILL_GLYPHS = " ▁▂▃▄▅▆▇█"
FREE_GLYPH = "·"
CACHED_GLYPH = "○"

CHANGED = Style(bold=True, underline=True)
VIOLATION = Style(bold=True, color="white", bgcolor="#c0392b")
DIM = Style(dim=True)


def seq_letter(seq_id: int) -> str:
    return LETTERS[seq_id % len(LETTERS)]


def seq_color(seq_id: int) -> str:
    return PALETTE[seq_id % len(PALETTE)]


@lru_cache(maxsize=512)
def seq_style(seq_id: int, *, selected: bool = False) -> Style:
    """Coloured letter text; selected: black on the colour (a selected sequence, a state-machine chip)."""
    if selected:
        return Style(color="black", bgcolor=seq_color(seq_id), bold=True)
    return Style(color=seq_color(seq_id), bold=True)


def seq_tag(seq_id: int) -> str:
    """'A#0': the letter the views draw plus the engine's seq_id."""
    return f"{seq_letter(seq_id)}#{seq_id}"


def fill_glyph(filled: int, block_size: int) -> str:
    if filled <= 0:
        return " "
    steps = len(FILL_GLYPHS) - 1
    return FILL_GLYPHS[max(1, min(steps, round(filled * steps / block_size)))]


def state_label(status: str) -> str:
    return f"{STATE_SYMBOLS.get(status, '?')} {status}"
