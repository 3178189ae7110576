"""The narration bar: the step's sentence, cut to the rows the layout gives it (3, 4 at 80x24). A
longer one ends its last row with "… m: more", and `m` shows it whole (again: the short form), so a
cut narration never passes for a whole one.

    bar.say(text)        the step's narration
    bar.toggle()         m: whole / cut
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.text import Text
from textual.content import Content
from textual.widgets import Static

from tracer.i18n import N_, _

MORE = N_(" … m: more")
EXPANDED_ROWS = 12  # m: enough for four admissions and their prefix hits at 80 columns


class NarrationBar(Static):
    """app.tcss gives it its rows: max-height, and EXPANDED_ROWS with the class -expanded."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.text = ""
        self.cut = False  # whether the text shown is cut short
        self.shown = ""  # the plain text shown

    def say(self, text: str) -> None:
        self.text = text
        self.fit()

    def toggle(self) -> None:
        self.toggle_class("-expanded")
        self.fit()

    def on_resize(self) -> None:
        self.fit()

    def fit(self) -> None:
        width, rows = self.content_size.width, self.max_rows()
        lines = wrapped(self.text, width) if width > 0 else []
        self.cut = rows is not None and len(lines) > rows
        self.shown = self.text
        if self.cut and rows is not None:
            shown = lines[:rows]
            last, more = shown[-1], _(MORE)
            fits = cell_len(last) + cell_len(more) <= width  # cells, not characters: wide glyphs take two
            shown[-1] = (last if fits else set_cell_size(last, max(0, width - cell_len(more))).rstrip()) + more
            self.shown = "\n".join(shown)
        self.update(Content(self.shown))

    def max_rows(self) -> int | None:
        if self.has_class("-expanded"):
            return EXPANDED_ROWS
        limit = self.styles.max_height
        return int(limit.value) if limit is not None and limit.is_cells else None


def wrapped(text: str, width: int) -> list[str]:
    """The rows Rich wraps text into at width, as the Static draws it."""
    console = Console(width=width, legacy_windows=False)
    return [line.plain.rstrip() for line in Text(text).wrap(console, width)]
