"""Every sequence of the step as a table row; cells that differ from the previous step are underlined.

Counter columns show `value→after` when the step changed them (the value the inputs were built
from, then the value at the end of the step). Column names: tokens = num_tokens, cached =
num_cached_tokens, sched = num_scheduled_tokens, prompt / gen = prompt / completion token counts.

Drawn line by line (only visible rows) from cells laid out once per step: a DataTable re-renders
every cell whenever anything changes, which costs tens of milliseconds per step.
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tracer.i18n import _
from tracer.replay.beams import beam_label, beams_of, in_group_order
from tracer.replay.colors import CHANGED, STATE_COLORS, STATE_SYMBOLS, VIOLATION, seq_style, seq_tag, state_label
from tracer.replay.messages import SeqSelected
from tracer.replay.samples import group_label, logprob_label, samples_of
from tracer.trace.invariants.rule import rule_named
from tracer.trace.readable import UNDECODABLE, is_byte_fragment, printable, token_label

COLUMNS = ("seq", "status", "tokens", "cached", "sched", "prompt", "gen/max", "block_table", "text")
# the column of each sequence field an invariant can name (Rule.field): a violation marks that cell
FIELD_COLUMNS = {
    "status_after": 1,
    "num_tokens": 2,
    "num_cached_tokens": 3,
    "num_scheduled_tokens": 4,
    "block_table": 7,
}
MAX_TABLE = 18  # characters of a block table before its middle is elided
MIN_TEXT_TAIL = 6  # characters of prompt + completion shown (from the end) when space is short
NEW_TOKEN_STYLE = Style(color="black", bgcolor="#ffd23f", bold=True)
HEADER_STYLE = Style(bold=True, color="#e0e0e0", bgcolor="#242f38")
SELECTED_STYLE = Style(bgcolor="#0b4f8a", bold=True)
GAP = 2  # spaces between columns


TEMPLATE_STYLE = Style(dim=True, italic=True)  # the chat template's tokens around the user's prompt
PROMPT_STYLE = Style(color="#9fb4c8")  # the prompt as the user wrote it


def prompt_parts(header: dict) -> dict[int, list[tuple[str, Style]]]:
    """seq_id -> the prompt as the model saw it, in drawable pieces: the chat template's text before
    and after the user's prompt dimmed, the prompt itself as written (whole characters, even where
    its tokens split a Chinese character or an emoji into bytes)."""
    parts = {}
    for request in header.get("requests", []):
        tokens = request.get("prompt_token_texts")
        prompt = request.get("prompt", "")
        if not tokens:
            parts[request.get("seq_id")] = [(printable(prompt), PROMPT_STYLE)]
            continue
        ids = request.get("prompt_token_ids") or [None] * len(tokens)
        found = find_prompt("".join(tokens), prompt)
        if found is None:  # token ids given, or a template that rewrote the text: token by token
            parts[request.get("seq_id")] = [("".join(token_label(t, i) for t, i in zip(tokens, ids)), PROMPT_STYLE)]
            continue
        before, after = found
        pieces = [
            (printable(before), TEMPLATE_STYLE),
            (printable(prompt), PROMPT_STYLE),
            (printable(after), TEMPLATE_STYLE),
        ]
        parts[request.get("seq_id")] = [piece for piece in pieces if piece[0]]
    return parts


def find_prompt(model_text: str, prompt: str) -> tuple[str, str] | None:
    """(template text before, after) the prompt inside the model's text (its tokens' texts joined,
    where a token holding only part of a character reads as \ufffd); None if it is not there."""
    if not prompt:
        return None
    pattern = "".join(
        re.escape(char) if len(char.encode("utf-8")) == 1 else f"(?:{re.escape(char)}|{UNDECODABLE}{{1,4}})"
        for char in prompt
    )
    matches = list(re.finditer(pattern, model_text))
    if not matches:
        return None
    last = matches[-1]  # the user's turn comes after any system prompt
    return model_text[: last.start()], model_text[last.end() :]


def arrow(before, after) -> str:
    return str(after) if before == after else f"{before}→{after}"


def status_cell(seq: dict) -> Text:
    before, after = seq.get("status_before", "?"), seq.get("status_after", "?")
    label = state_label(after)
    if before != after:
        label = f"{STATE_SYMBOLS.get(before, '?')}→{label}"
    return Text(label, Style(color=STATE_COLORS.get(after)))


def short_table(table: list[int], limit: int = MAX_TABLE) -> str:
    """'[7,8,9,…,13,14]' when the whole list would be longer than limit characters."""
    text = "[" + ",".join(map(str, table)) + "]"
    if len(text) <= limit:
        return text
    head, tail = [], []
    for i in range(len(table) // 2):
        trial = "[" + ",".join(map(str, table[: i + 1])) + ",…," + ",".join(map(str, table[-(i + 1) :])) + "]"
        if len(trial) > limit:
            break
        head, tail = table[: i + 1], table[-(i + 1) :]
    return "[" + ",".join(map(str, head)) + ",…," + ",".join(map(str, tail)) + "]" if head else "[…]"


def block_table_cell(seq: dict) -> str:
    before, after = seq.get("block_table", []), seq.get("block_table_after", [])
    table = short_table(after)
    added = len(after) - len(before)
    if after[: len(before)] == before and added > 0:
        table += f" +{added}"
    elif before != after and before:
        table += " " + (_("(new)") if after else _("(freed)"))
    return table


def row_cells(seq: dict, max_tokens: dict[int, int] | None = None) -> list:
    """Every cell but the text: what 'changed since the previous step' compares. gen/max: the
    completion tokens so far and the request's max_tokens (a trace without params: gen alone)."""
    completion = seq.get("num_tokens_after", 0) - seq.get("num_prompt_tokens", 0)
    limit = (max_tokens or {}).get(seq["seq_id"])
    return [
        Text(seq_tag(seq["seq_id"]), seq_style(seq["seq_id"])),
        status_cell(seq),
        arrow(seq.get("num_tokens"), seq.get("num_tokens_after")),
        arrow(seq.get("num_cached_tokens"), seq.get("num_cached_tokens_after")),
        str(seq.get("num_scheduled_tokens", 0)),
        str(seq.get("num_prompt_tokens", 0)),
        f"{completion}/{limit}" if limit is not None else str(completion),
        block_table_cell(seq),
    ]


def row_labels(seqs: list) -> dict[int, str]:
    """What follows each sequence's tag: a beam's parent and its search's bracket ('<A#0 ├0 ✂'), or
    the bracket and request.sample of one of n samples (' ┌1.0'); none for a request of one sequence."""
    beams = beams_of(seqs)
    samples = samples_of(s for s in seqs if s["seq_id"] not in beams)
    labels = {seq_id: beam_label(beam) for seq_id, beam in beams.items()}
    labels.update({seq_id: " " + group_label(sample) for seq_id, sample in samples.items()})
    return labels


def offending_cells(step: dict) -> set[tuple[int, int]]:
    """(seq_id, column) of the cells this step's violations are about, where the invariant names one."""
    cells = set()
    for violation in step.get("violations") or []:
        rule = rule_named(str(violation.get("invariant", "")))
        if rule is not None and rule.field in FIELD_COLUMNS and isinstance(violation.get("seq_id"), int):
            cells.add((violation["seq_id"], FIELD_COLUMNS[rule.field]))
    return cells


def marked_cell(cell) -> Text:
    """✗ before the value and the violation's colours: a symbol, not colour alone."""
    text = Text("✗", VIOLATION)
    text.append(plain(cell), VIOLATION)
    return text


def plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def new_text(seq: dict) -> tuple[str, str]:
    """(the completion before this step's new token, the new token's part), both drawable. A byte
    of a multi-byte character has no text of its own: its part is the decoded text's tail, one ⟨?⟩
    while the character is incomplete, the character itself once its last byte arrived."""
    texts = seq.get("new_token_texts", [])
    output = seq.get("output_text", "")
    new = "".join(texts)
    if texts and all(is_byte_fragment(t) for t in texts) and output:
        stable = output.rstrip(UNDECODABLE)
        if len(stable) < len(output):  # still incomplete: one placeholder for its bytes so far
            return printable(stable), printable(output[len(stable) :])
        return printable(output[:-1]), printable(output[-1])
    if not (new and output.endswith(new)):
        return printable(output), ""
    ids = seq.get("new_token_ids") or [None] * len(texts)
    return printable(output[: len(output) - len(new)]), "".join(token_label(t, i) for t, i in zip(texts, ids))


def text_cell(seq: dict, prompt: list[tuple[str, Style]], tail: int) -> Text:
    """The prompt (its chat template dimmed), the completion plain, this step's new tokens
    highlighted; only the tail fits."""
    before, new_shown = new_text(seq)
    parts: list[tuple[str, Style | None]] = [(new_shown, NEW_TOKEN_STYLE), (before, None), *reversed(prompt)]
    if lp := logprob_label(seq):  # the new token's logprob, where the request asked for logprobs
        parts.insert(0, (lp, TEMPLATE_STYLE))
    shown, room = [], tail
    for part, style in parts:  # from the end: only what fits
        if room <= 0:
            break
        piece = part[-room:] if len(part) > room else part
        while cell_len(piece) > room:  # wide characters (Chinese, emoji) take two cells
            piece = piece[1:]
        room -= max(1, cell_len(piece)) if piece else 0
        shown.append((piece, style))
    text = Text(no_wrap=True, overflow="ellipsis")
    if room <= 0:
        text.append("…")
        first, style = shown[-1]
        shown[-1] = (first[1:], style)
    for piece, style in reversed(shown):
        text.append(piece, style)
    return text


def segments_of(cell, width: int, extra: Style | None = None) -> list[Segment]:
    """A cell as segments padded to width, with `extra` (changed, selected) laid over its styles."""
    text = cell if isinstance(cell, Text) else Text(str(cell))
    out = []
    for span_text, style in spans_of(text):
        style = style + extra if extra else style
        out.append(Segment(span_text, style))
    pad = width - cell_len(text.plain)
    if pad > 0:
        out.append(Segment(" " * pad, extra if extra and extra.bgcolor else None))
    return out


def spans_of(text: Text) -> list[tuple[str, Style]]:
    """(text, style) pieces of a rich Text, without a console render."""
    base = text.style if isinstance(text.style, Style) else Style.parse(text.style or "")
    if not text.spans:
        return [(text.plain, base)]
    cuts = sorted({0, len(text.plain), *(s.start for s in text.spans), *(s.end for s in text.spans)})
    pieces = []
    for start, end in zip(cuts, cuts[1:]):
        style = base
        for span in text.spans:
            if span.start <= start and end <= span.end:
                span_style = span.style if isinstance(span.style, Style) else Style.parse(span.style)
                style = style + span_style
        pieces.append((text.plain[start:end], style))
    return pieces


class SequencesView(ScrollView, can_focus=True):
    """One row per sequence; ↑/↓ or a click selects a sequence (SeqSelected)."""

    BINDINGS = [Binding("up", "move(-1)", "seq", show=False), Binding("down", "move(1)", "seq", show=False)]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.row_ids: list[int] = []
        self.rows: list[list] = []  # cells per row, text last
        self.changed: list[list[bool]] = []
        self.widths: list[int] = [len(name) for name in COLUMNS]
        self.selected: int | None = None
        self.prompts: tuple[int, dict[int, list]] = (0, {})  # (id of the header, its prompt pieces)
        self.shown: tuple | None = None

    def on_resize(self, event: events.Resize) -> None:
        if self.shown is not None:  # the text column's room depends on the width
            self.show(*self.shown)

    def show(self, step: dict, prev: dict | None, header: dict) -> None:
        self.shown = (step, prev, header)
        limits = {
            r.get("seq_id"): r["params"]["max_tokens"]
            for r in header.get("requests", [])
            if isinstance(r.get("params"), dict) and "max_tokens" in r["params"]
        }
        old_rows = {s["seq_id"]: row_cells(s, limits) for s in prev.get("seqs", [])} if prev else {}
        seqs = in_group_order(step.get("seqs", []))  # a beam search's rows together
        rows = [row_cells(seq, limits) for seq in seqs]
        labels = row_labels(seqs)
        for seq_id, cells in [*zip((seq["seq_id"] for seq in seqs), rows), *old_rows.items()]:
            if label := labels.get(seq_id):
                cells[0] = Text(f"{plain(cells[0])}{label}", cells[0].style)
        self.widths = [
            max([len(name)] + [cell_len(plain(row[i])) for row in rows]) for i, name in enumerate(COLUMNS[:-1])
        ]
        tail = max(MIN_TEXT_TAIL, self.scrollable_content_region.width - sum(w + GAP for w in self.widths))
        if self.prompts[0] != id(header):
            self.prompts = (id(header), prompt_parts(header))
        self.changed = []
        for seq, cells in zip(seqs, rows):
            old = old_rows.get(seq["seq_id"])
            self.changed.append([old is None or plain(cell) != plain(old[i]) for i, cell in enumerate(cells)])
            cells.append(text_cell(seq, self.prompts[1].get(seq["seq_id"], []), tail))
        index = {seq["seq_id"]: i for i, seq in enumerate(seqs)}
        for seq_id, column in offending_cells(step):
            if seq_id in index:  # marked after `changed` was taken: a mark is not a change
                row = rows[index[seq_id]]
                row[column] = marked_cell(row[column])
                self.widths[column] = max(self.widths[column], cell_len(row[column].plain))
        self.widths.append(max([len(COLUMNS[-1])] + [cell_len(row[-1].plain) for row in rows]))
        self.rows = rows
        self.row_ids = [seq["seq_id"] for seq in seqs]
        self.virtual_size = Size(sum(w + GAP for w in self.widths) - GAP, len(rows) + 1)
        self.refresh()

    def select(self, seq_id: int | None) -> None:
        self.selected = seq_id
        if seq_id in self.row_ids:
            self.scroll_to_row(self.row_ids.index(seq_id))
        self.refresh()

    def scroll_to_row(self, index: int) -> None:
        visible = self.scrollable_content_region.height - 1
        top = self.scroll_offset.y
        if index < top:
            self.scroll_to(y=index, animate=False)
        elif visible > 0 and index >= top + visible:
            self.scroll_to(y=index - visible + 1, animate=False)

    # ---- rendering ------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        x = self.scroll_offset.x
        if y == 0:
            segments = []
            for name, column_width in zip(COLUMNS, self.widths):
                segments.append(Segment(name.ljust(column_width + GAP), HEADER_STYLE))
            return Strip(segments).crop(x, x + width).extend_cell_length(width, HEADER_STYLE)
        index = y - 1 + self.scroll_offset.y
        if index >= len(self.rows):
            return Strip.blank(width)
        selected = self.row_ids[index] == self.selected
        row_style = SELECTED_STYLE if selected else None
        segments = []
        for i, (cell, column_width) in enumerate(zip(self.rows[index], self.widths)):
            changed = i < len(self.changed[index]) and self.changed[index][i]
            extra = CHANGED + row_style if changed and row_style else (CHANGED if changed else row_style)
            segments.extend(segments_of(cell, column_width, extra))
            segments.append(Segment(" " * GAP, row_style))
        strip = Strip(segments).crop(x, x + width)
        return strip.extend_cell_length(width, row_style)

    # ---- selection ------------------------------------------------------------------------
    def action_move(self, delta: int) -> None:
        if not self.row_ids:
            return
        if self.selected not in self.row_ids:
            index = 0 if delta > 0 else len(self.row_ids) - 1
        else:
            index = max(0, min(len(self.row_ids) - 1, self.row_ids.index(self.selected) + delta))
        self.post_message(SeqSelected(self.row_ids[index]))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y < 1:
            return
        index = offset.y - 1 + self.scroll_offset.y
        if index < len(self.row_ids):
            self.post_message(SeqSelected(self.row_ids[index]))
