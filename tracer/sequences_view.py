"""Every sequence of the step as a table row; cells that differ from the previous step are highlighted.

Counter columns show `value→after` when the step changed them (the value the inputs were built
from, then the value at the end of the step). Column names: tokens = num_tokens, cached =
num_cached_tokens, sched = num_scheduled_tokens, prompt / gen = prompt / completion token counts.
"""
from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual import events
from textual.message import Message
from textual.widgets import DataTable

from tracer.colors import CHANGED, DIM, printable, STATE_COLORS, STATE_SYMBOLS, seq_style, seq_tag

COLUMNS = ("seq", "status", "tokens", "cached", "sched", "prompt", "gen", "block_table", "text")
MIN_TEXT_TAIL = 10      # characters of prompt + completion shown (from the end) when space is short
NEW_TOKEN_STYLE = Style(color="black", bgcolor="#ffd23f", bold=True)


def prompt_text(header: dict, seq_id: int) -> str:
    for request in header.get("requests", []):
        if request.get("seq_id") == seq_id:
            texts = request.get("prompt_token_texts")
            return "".join(texts) if texts else request.get("prompt", "")
    return ""


def arrow(before, after) -> str:
    return str(after) if before == after else f"{before}→{after}"


def status_cell(seq: dict) -> Text:
    before, after = seq.get("status_before", "?"), seq.get("status_after", "?")
    label = f"{STATE_SYMBOLS.get(after, '?')} {after}"
    if before != after:
        label = f"{STATE_SYMBOLS.get(before, '?')}→{label}"
    return Text(label, Style(color=STATE_COLORS.get(after)))


def block_table_cell(seq: dict) -> str:
    before, after = seq.get("block_table", []), seq.get("block_table_after", [])
    table = "[" + ",".join(map(str, after)) + "]"
    added = len(after) - len(before)
    if after[:len(before)] == before and added > 0:
        table += f" +{added}"
    elif before != after and before:
        table += " (new)" if after else " (freed)"
    return table


def text_cell(seq: dict, header: dict, tail: int) -> Text:
    """Prompt dimmed, completion plain, this step's new tokens highlighted; only the tail fits."""
    new = "".join(seq.get("new_token_texts", []))
    output = seq.get("output_text", "")
    old_output = output[:len(output) - len(new)] if new and output.endswith(new) else output
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(printable(prompt_text(header, seq["seq_id"])), DIM)
    text.append(printable(old_output))
    if new and output.endswith(new):
        text.append(printable(new), NEW_TOKEN_STYLE)
    if len(text) > tail:
        text = Text("…") + text[len(text) - tail + 1:]
    return text


def row_cells(seq: dict, header: dict, tail: int = 40) -> list:
    completion = seq.get("num_tokens_after", 0) - seq.get("num_prompt_tokens", 0)
    return [
        Text(seq_tag(seq["seq_id"]), seq_style(seq["seq_id"])),
        status_cell(seq),
        arrow(seq.get("num_tokens"), seq.get("num_tokens_after")),
        arrow(seq.get("num_cached_tokens"), seq.get("num_cached_tokens_after")),
        str(seq.get("num_scheduled_tokens", 0)),
        str(seq.get("num_prompt_tokens", 0)),
        str(completion),
        block_table_cell(seq),
        text_cell(seq, header, tail),
    ]


def plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def highlight_changes(cells: list, old: list | None) -> list:
    """Mark cells whose text differs from the previous step's (the text column marks its own news)."""
    marked = []
    for i, cell in enumerate(cells):
        if old is not None and i < len(cells) - 1 and plain(cell) != plain(old[i]):
            cell = cell.copy() if isinstance(cell, Text) else Text(cell)
            cell.stylize(CHANGED)
        elif old is None and i < len(cells) - 1:
            cell = cell if isinstance(cell, Text) else Text(cell)
            cell.stylize(CHANGED)
        marked.append(cell)
    return marked


class SequencesView(DataTable):
    """One row per sequence; moving the cursor onto a row selects that sequence."""

    class SeqHighlighted(Message):
        def __init__(self, seq_id: int) -> None:
            super().__init__()
            self.seq_id = seq_id

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, show_cursor=False, **kwargs)
        self.row_ids: list[int] = []
        self.selected: int | None = None

    def show(self, step: dict, prev: dict | None, header: dict) -> None:
        old_rows = {s["seq_id"]: row_cells(s, header) for s in prev.get("seqs", [])} if prev else {}
        rows = [row_cells(seq, header) for seq in step.get("seqs", [])]
        tail = self.text_room(rows)
        with self.prevent(DataTable.RowHighlighted):   # a redraw is not a user's choice
            self.clear(columns=True)   # column widths must not remember earlier steps
            self.add_columns(*COLUMNS)
            self.row_ids = []
            for seq, cells in zip(step.get("seqs", []), rows):
                cells[-1] = text_cell(seq, header, tail)
                cells = highlight_changes(cells, old_rows.get(seq["seq_id"]))
                self.add_row(*cells, key=str(seq["seq_id"]))
                self.row_ids.append(seq["seq_id"])
            self.move_to_selected()

    def text_room(self, rows: list[list]) -> int:
        """Characters left for the text column once the other columns (plus cell padding) fit."""
        used = sum(max([len(name)] + [len(plain(row[i])) for row in rows]) + 2
                   for i, name in enumerate(COLUMNS[:-1]))
        return max(MIN_TEXT_TAIL, self.size.width - used - 3)

    def select(self, seq_id: int | None) -> None:
        self.selected = seq_id
        with self.prevent(DataTable.RowHighlighted):
            self.move_to_selected()
            self.show_cursor = seq_id is not None   # no cursor row until a sequence is selected

    def action_cursor_down(self) -> None:
        self.start_cursor() or super().action_cursor_down()

    def action_cursor_up(self) -> None:
        self.start_cursor() or super().action_cursor_up()

    async def _on_click(self, event: events.Click) -> None:
        if event.style.meta.get("row", -1) >= 0:
            self.show_cursor = True   # a click on a row selects it even before any selection
        await super()._on_click(event)

    def start_cursor(self) -> bool:
        """The first ↑/↓ without a selection selects the row under the (hidden) cursor."""
        if self.show_cursor or not self.row_ids:
            return False
        self.post_message(self.SeqHighlighted(self.row_ids[min(self.cursor_row, len(self.row_ids) - 1)]))
        return True

    def move_to_selected(self) -> None:
        if self.selected in self.row_ids:
            self.move_cursor(row=self.row_ids.index(self.selected), animate=False)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key.value is None:
            return
        seq_id = int(event.row_key.value)
        if seq_id != self.selected:
            self.post_message(self.SeqHighlighted(seq_id))
