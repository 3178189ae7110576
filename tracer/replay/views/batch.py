"""The flat step inputs the model ran on: one column per scheduled token, grouped by request.

Token rows (input_ids, input_texts, positions, slot_mapping, logits_indices) have a value per
token; request rows (query_start_loc, seq_lens, block_tables) have one per request, written in
the request's first column. Row labels stay put while the columns scroll sideways.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tracer.i18n import _
from tracer.replay.colors import seq_color, seq_style, seq_tag
from tracer.replay.messages import SeqSelected
from tracer.trace.readable import token_label

TOKEN_ROWS = ("input_ids", "input_texts", "positions", "slot_mapping", "logits_indices")
REQUEST_ROWS = ("query_start_loc", "seq_lens", "block_tables")
ROWS = ("seq_ids", *TOKEN_ROWS, *REQUEST_ROWS)
LABEL_WIDTH = max(map(len, ROWS)) + 1
MAX_TEXT = 8  # characters of a decoded token
MAX_TABLE = 24  # characters of a block table
LABEL_STYLE = Style(color="#8a8a8a")
SEPARATOR = Style(color="#6c6c6c")
LOGIT_KEPT = Style(color="#90be6d", bold=True)
LOGIT_DISCARDED = Style(color="#ff6b6b", strike=True)


def token_text(text: str, token_id: int | None = None) -> str:
    """A token's text, at most MAX_TEXT cells (a Chinese character takes two, and is never halved)."""
    shown = token_label(text, token_id)
    if not shown.startswith("⟨id "):
        shown = shown.replace(" ", "␣")
    return shown if cell_len(shown) <= MAX_TEXT else set_cell_size(shown, MAX_TEXT - 1).rstrip() + "…"


def table_text(table: list[int]) -> str:
    text = "[" + ",".join(map(str, table)) + "]"
    return text if len(text) <= MAX_TABLE else text[: MAX_TABLE - 2] + "…]"


def padded(text: str, width: int) -> str:
    """text and spaces to width cells."""
    return text + " " * max(0, width - cell_len(text))


@dataclass(slots=True)
class Group:
    seq_id: int
    first: int  # token index range [first, end)
    end: int


def groups_of(inputs: dict) -> list[Group]:
    qsl = inputs.get("query_start_loc", [0])
    return [Group(seq_id, qsl[i], qsl[i + 1]) for i, seq_id in enumerate(inputs.get("seq_ids", []))]


def token_cells(inputs: dict, group_index: int, token: int) -> dict[str, tuple[str, Style | None]]:
    """The token rows' text (and an optional style override) for one token column."""
    texts = inputs.get("input_texts") or []
    cells: dict[str, tuple[str, Style | None]] = {
        "input_ids": (str(inputs["input_ids"][token]), None),
        "input_texts": (token_text(texts[token], inputs["input_ids"][token]) if token < len(texts) else "?", None),
        "positions": (str(inputs["positions"][token]), None),
        "slot_mapping": (str(inputs["slot_mapping"][token]), None),
        "logits_indices": ("", None),
    }
    if inputs["logits_indices"][group_index] == token:
        discarded = bool(inputs.get("discard", [False] * (group_index + 1))[group_index])
        cells["logits_indices"] = (f"{'✗' if discarded else '▲'}{token}", LOGIT_DISCARDED if discarded else LOGIT_KEPT)
    return cells


def request_cells(inputs: dict, group_index: int) -> dict[str, str]:
    tables = inputs.get("block_tables") or []
    return {
        "seq_ids": seq_tag(inputs["seq_ids"][group_index]),
        "query_start_loc": str(inputs["query_start_loc"][group_index]),
        "seq_lens": str(inputs["seq_lens"][group_index]),
        "block_tables": table_text(tables[group_index]) if group_index < len(tables) else "",
    }


class BatchView(ScrollView, can_focus=True):
    """Flat batch; click a column to select its sequence."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step: dict = {}
        self.selected: int | None = None
        self.rows: list[list[Segment]] = []
        self.column_owner: list[tuple[int, int, int]] = []  # (x start, x end, seq_id)

    def show(self, step: dict, prev: dict | None, header: dict) -> None:
        self.step = step
        self.build_rows()

    def select(self, seq_id: int | None) -> None:
        self.selected = seq_id
        self.build_rows()

    def build_rows(self) -> None:
        """Lay out the whole batch once per step; render_line only crops."""
        inputs = self.step.get("inputs") or {}
        rows: dict[str, list[Segment]] = {name: [] for name in ROWS}
        self.column_owner = []
        x = 0
        for index, group in enumerate(groups_of(inputs)):
            width = self.add_group(rows, inputs, index, group)
            self.column_owner.append((x, x + width, group.seq_id))
            x += width + 1
            for segments in rows.values():
                segments.append(Segment("│", SEPARATOR))
        qsl = inputs.get("query_start_loc", [0])
        if len(qsl) > 1:  # query_start_loc has one more entry than there are requests
            for name, segments in rows.items():
                segments.append(Segment(str(qsl[-1]) if name == "query_start_loc" else " " * len(str(qsl[-1]))))
            x += len(str(qsl[-1]))
        self.rows = [rows[name] for name in ROWS]
        self.virtual_size = Size(LABEL_WIDTH + x, len(ROWS))
        self.refresh()

    def add_group(self, rows: dict[str, list[Segment]], inputs: dict, index: int, group: Group) -> int:
        """Append one request's columns to every row; returns the group's width."""
        selected = group.seq_id == self.selected
        base = Style(color=seq_color(group.seq_id)) + (Style(reverse=True) if selected else Style())
        columns = [token_cells(inputs, index, t) for t in range(group.first, group.end)]
        widths = [max(cell_len(text) for text, _style in cells.values()) + 1 for cells in columns]
        per_request = request_cells(inputs, index)
        width = max(sum(widths), max(cell_len(text) for text in per_request.values()) + 1)
        if widths:
            widths[-1] += width - sum(widths)
        for name in TOKEN_ROWS:
            for cells, cell_width in zip(columns, widths):
                text, style = cells[name]
                rows[name].append(Segment(padded(text, cell_width), base + style if style else base))
        for name, text in per_request.items():
            style = seq_style(group.seq_id, selected=True) if name == "seq_ids" else base
            rows[name].append(Segment(padded(text, width), style))
        return width

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        row = y + self.scroll_offset.y
        if not self.rows or not self.step.get("inputs", {}).get("seq_ids"):
            text = _("(nothing scheduled this step)") if y == 0 else ""
            return Strip([Segment(set_cell_size(text, width), LABEL_STYLE)], width)
        if row >= len(self.rows):
            return Strip.blank(width)
        label = Segment(ROWS[row].rjust(LABEL_WIDTH - 1) + " ", LABEL_STYLE)
        body = Strip(self.rows[row]).crop(self.scroll_offset.x, self.scroll_offset.x + width - LABEL_WIDTH)
        return Strip([label, *body]).extend_cell_length(width).crop(0, width)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.x < LABEL_WIDTH:
            return
        x = offset.x - LABEL_WIDTH + self.scroll_offset.x
        for start, end, seq_id in self.column_owner:
            if start <= x < end:
                self.post_message(SeqSelected(seq_id))
                return
