"""The sequence state machine: WAITING -> RUNNING (prefill, decode) -> FINISHED, one chip per sequence.

The view is a pure function of (step, previous step): chips sit in the node of their state at the
end of the step; the edges the step took light up, and chips that moved travel along them while
`progress` animates from 0 to 1 (kept at 1 when animations are off).

The two lanes of RUNNING are nano-vllm's phases, read from the step's counters: a sequence is in
the prefill lane while it is part-way through (re)computing its tokens (the step computed some and
kept no sampled token), and in the decode lane when only its newest, sampled token is left to
compute. vLLM v1 has no phases: every step it catches num_computed_tokens up to num_tokens, by as
many tokens as the budget allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.cells import cell_len, get_character_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from nanoengine.sequence import EventKind
from tracer.i18n import N_, _
from tracer.replay.colors import CHANGED, STATE_COLORS, seq_letter, seq_style, state_label
from tracer.replay.messages import SeqSelected

EDGE_LABELS = {  # the words beside the edges (the edges themselves are named in English in the code)
    "admit": N_("admit"),
    "preempt": N_("preempt"),
    "finish": N_("finish"),
    "chunk": N_("chunk"),
    "done": N_("done"),
}
EDGE_OFF = Style(color="#6c6c6c")
EDGE_ON = Style(color="#ffd23f", bold=True)
LABEL_OFF = Style(color="#8a8a8a")
GAP = 8  # columns between two nodes: room for 'preempt' and an arrow
MIN_WIDTH, MIN_HEIGHT = 36, 6


@dataclass(slots=True)
class Move:
    seq_id: int
    edges: list[str]  # in the order taken: admit, chunk, done, preempt, finish


@dataclass(slots=True)
class Layout:
    """Cell coordinates of the three nodes and their edges for one widget size."""

    width: int
    height: int
    wait: tuple[int, int]  # (left x, right x) of each box, borders included
    run: tuple[int, int]
    fin: tuple[int, int]
    prefill_rows: list[int] = field(default_factory=list)
    done_row: int = 0
    decode_rows: list[int] = field(default_factory=list)
    top: int = 1
    bottom: int = 5

    @property
    def inner_rows(self) -> list[int]:
        return list(range(self.top + 1, self.bottom))


def node_of(seq: dict) -> str:
    """WAITING, PREFILL, DECODE or FINISHED at the end of the step."""
    status = seq.get("status_after", "WAITING")
    if status != "RUNNING":
        return status
    return "PREFILL" if is_prefilling(seq) else "DECODE"


def is_prefilling(seq: dict) -> bool:
    """Mid-prefill at the end of the step: this step computed some of its tokens and kept no
    sampled token; or, when it was not scheduled, more than one token (or the prompt's last) is
    still to compute."""
    if seq.get("num_scheduled_tokens", 0) > 0:
        return not seq.get("new_token_ids")
    num_tokens = seq.get("num_tokens_after", 0)
    return num_tokens - seq.get("num_cached_tokens_after", 0) > 1 or num_tokens <= seq.get("num_prompt_tokens", 0)


def moves_of(step: dict) -> list[Move]:
    """The edges each sequence took this step, from the step's events."""
    edge_of = {
        EventKind.ADMITTED: "admit",
        EventKind.PREFILL_DONE: "done",
        EventKind.PREEMPTED: "preempt",
        EventKind.FINISHED: "finish",
    }
    done = {e["seq_id"] for e in step.get("events", []) if e["kind"] == EventKind.PREFILL_DONE}
    moves: dict[int, Move] = {}
    for event in step.get("events", []):
        kind, seq_id = event["kind"], event["seq_id"]
        edge = edge_of.get(kind)
        if kind == EventKind.PREFILL_CHUNK and seq_id not in done:
            edge = "chunk"
        if edge:
            moves.setdefault(seq_id, Move(seq_id, [])).edges.append(edge)
    for move in moves.values():  # the engine emits prefill_done after finishing the batch: reorder
        if "done" in move.edges and "finish" in move.edges:
            move.edges.remove("done")
            move.edges.insert(move.edges.index("finish"), "done")
    return list(moves.values())


def make_layout(width: int, height: int) -> Layout:
    width, height = max(width, MIN_WIDTH), max(height, MIN_HEIGHT)
    boxes = width - 2 * GAP
    side = max(8, boxes // 4)
    wait = (0, side - 1)
    run = (side + GAP, width - side - GAP - 1)
    fin = (width - side, width - 1)
    layout = Layout(width, height, wait, run, fin, top=1, bottom=height - 1)
    inner = layout.inner_rows
    num_prefill = max(1, (len(inner) - 1) // 2)
    layout.prefill_rows = inner[:num_prefill]
    layout.done_row = inner[num_prefill]
    layout.decode_rows = inner[num_prefill + 1 :] or [inner[-1]]
    return layout


class Canvas:
    """A grid of (char, style) cells turned into strips. A wide character (Chinese) fills two cells:
    its own and an empty one after it, so every row keeps the canvas's width in cells."""

    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.chars = [[" "] * width for _row in range(height)]
        self.styles: list[list[Style | None]] = [[None] * width for _row in range(height)]

    def put(self, x: int, y: int, text: str, style: Style | None = None) -> None:
        if not 0 <= y < self.height:
            return
        for char in text:
            cells = get_character_cell_size(char)
            if 0 <= x and x + cells <= self.width:
                for i in range(cells):
                    self.clear_half(x + i, y)
                    self.chars[y][x + i] = "" if i else char
                    self.styles[y][x + i] = style
            x += cells

    def clear_half(self, x: int, y: int) -> None:
        """Before a cell is written: a wide character it is half of becomes a space."""
        row = self.chars[y]
        if row[x] == "" and x > 0:  # the second half of the character to its left
            row[x - 1] = " "
        elif x + 1 < self.width and row[x + 1] == "" and get_character_cell_size(row[x]) == 2:
            row[x + 1] = " "

    def to_strips(self) -> list[Strip]:
        """One strip per row, a segment per run of equally styled cells."""
        strips = []
        for y in range(self.height):
            segments, run_start, style = [], 0, self.styles[y][0]
            for x in range(1, self.width + 1):
                if x == self.width or self.styles[y][x] != style:
                    segments.append(Segment("".join(self.chars[y][run_start:x]), style))
                    if x < self.width:
                        run_start, style = x, self.styles[y][x]
            strips.append(Strip(segments, self.width))
        return strips


class StateMachineView(Widget, can_focus=True):
    """WAITING, RUNNING and FINISHED boxes with the admit / chunk / done / preempt / finish edges."""

    progress: reactive[float] = reactive(1.0)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step: dict = {}
        self.moves: list[Move] = []
        self.selected: int | None = None
        self.animations = True
        self.chip_cells: dict[tuple[int, int], int] = {}
        self.strips: list[Strip] | None = None  # the drawing, rebuilt after any change

    def on_resize(self, event: events.Resize) -> None:
        self.strips = None

    def refresh(self, *args, **kwargs):
        self.strips = None
        return super().refresh(*args, **kwargs)

    def show(self, step: dict, prev: dict | None, header: dict) -> None:
        self.step = step
        self.moves = moves_of(step)
        moving = any(edge != "chunk" for move in self.moves for edge in move.edges)
        if self.animations and moving and self.is_mounted:
            self.progress = 0.0
            self.animate("progress", 1.0, duration=0.9, easing="in_out_cubic")
        else:
            self.progress = 1.0
        self.refresh()

    def select(self, seq_id: int | None) -> None:
        self.selected = seq_id
        self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        if self.strips is None or (self.strips and self.strips[0].cell_length != max(width, MIN_WIDTH)):
            self.strips = self.draw()
        if y >= len(self.strips):
            return Strip.blank(width)
        return self.strips[y].crop(0, width)

    def draw(self) -> list[Strip]:
        layout = make_layout(self.content_size.width, self.content_size.height)
        canvas = Canvas(layout.width, layout.height)
        lit = {edge for move in self.moves for edge in move.edges}
        self.draw_nodes(canvas, layout)
        self.draw_edges(canvas, layout, lit)
        self.chip_cells = {}
        self.draw_chips(canvas, layout)
        return canvas.to_strips()

    # ---- drawing -------------------------------------------------------------------------
    def draw_nodes(self, canvas: Canvas, layout: Layout) -> None:
        for status, (left, right) in (("WAITING", layout.wait), ("RUNNING", layout.run), ("FINISHED", layout.fin)):
            style = Style(color=STATE_COLORS[status])
            label = state_label(status)
            center = (left + right + 1) // 2
            canvas.put(
                max(0, min(layout.width - cell_len(label), center - cell_len(label) // 2)),
                0,
                label,
                style + Style(bold=True),
            )
            draw_box(canvas, left, layout.top, right, layout.bottom, style)
        left, right = layout.run
        running = Style(color=STATE_COLORS["RUNNING"])
        canvas.put(left, layout.done_row, "├" + "╌" * (right - left - 1) + "┤", running)
        canvas.put(left + 1, layout.top, _("prefill"), running + Style(italic=True))
        canvas.put(left + 1, layout.done_row, _("decode"), running + Style(italic=True))

    def draw_edges(self, canvas: Canvas, layout: Layout, lit: set[str]) -> None:
        def style(edge: str) -> Style:
            return EDGE_ON if edge in lit else EDGE_OFF

        def label_style(edge: str) -> Style:
            return EDGE_ON if edge in lit else LABEL_OFF

        x0, x1 = layout.wait[1] + 1, layout.run[0] - 1
        admit_y, back_y = layout.prefill_rows[0], layout.decode_rows[-1]
        canvas.put(x0, admit_y, "─" * (x1 - x0) + "▶", style("admit"))
        canvas.put(x0 + 1, admit_y - 1, _(EDGE_LABELS["admit"]), label_style("admit"))
        canvas.put(x0, back_y, "◀" + "─" * (x1 - x0), style("preempt"))
        canvas.put(x0, back_y + 1, _(EDGE_LABELS["preempt"]), label_style("preempt"))
        f0, f1 = layout.run[1] + 1, layout.fin[0] - 1
        finish_y = layout.decode_rows[0]
        canvas.put(f0, finish_y, "─" * (f1 - f0) + "▶", style("finish"))
        canvas.put(f0 + 1, finish_y - 1, _(EDGE_LABELS["finish"]), label_style("finish"))
        left, right = layout.run
        roomy = right - left > 20
        chunk, done = ("↻ " + _(EDGE_LABELS["chunk"]), "↓ " + _(EDGE_LABELS["done"])) if roomy else ("↻", "↓")
        canvas.put(right - cell_len(chunk) - 1, layout.top, chunk, style("chunk"))
        canvas.put(right - cell_len(done) - 1, layout.done_row, done, style("done"))

    def draw_chips(self, canvas: Canvas, layout: Layout) -> None:
        traveling = self.traveling_positions(layout) if self.progress < 1.0 else {}
        moved = {move.seq_id for move in self.moves if set(move.edges) - {"chunk"}}
        slots = {
            "WAITING": node_slots(layout.wait, layout.inner_rows),
            "PREFILL": node_slots(layout.run, layout.prefill_rows),
            "DECODE": node_slots(layout.run, layout.decode_rows),
            "FINISHED": node_slots(layout.fin, layout.inner_rows),
        }
        by_node: dict[str, list[dict]] = {node: [] for node in slots}
        for seq in self.step.get("seqs", []):
            if seq["seq_id"] not in traveling:
                by_node[node_of(seq)].append(seq)
        for node, seqs in by_node.items():
            self.place_chips(canvas, slots[node], seqs, moved)
        for seq_id, (x, y) in traveling.items():
            canvas.put(x, y, seq_letter(seq_id), seq_style(seq_id, selected=True) + CHANGED)
            self.chip_cells[(x, y)] = seq_id

    def place_chips(self, canvas: Canvas, slots: list[tuple[int, int]], seqs: list[dict], moved: set[int]) -> None:
        overflow = len(seqs) > len(slots)
        shown = seqs[: len(slots) - 1] if overflow else seqs
        for (x, y), seq in zip(slots, shown):
            seq_id = seq["seq_id"]
            style = seq_style(seq_id, selected=True)
            if seq_id in moved:
                style += CHANGED
            if seq_id == self.selected:
                style += Style(reverse=True)
            canvas.put(x, y, seq_letter(seq_id), style)
            self.chip_cells[(x, y)] = seq_id
        if overflow and slots:
            x, y = slots[-1]
            canvas.put(x, y, f"+{len(seqs) - len(shown)}", Style(bold=True))

    def traveling_positions(self, layout: Layout) -> dict[int, tuple[int, int]]:
        """Where each moving chip is along its path of edges at the current progress."""
        positions = {}
        for move in self.moves:
            path = [cell for edge in move.edges for cell in edge_path(edge, layout)]
            if path:
                positions[move.seq_id] = path[min(len(path) - 1, int(self.progress * len(path)))]
        return positions

    # ---- mouse ----------------------------------------------------------------------------
    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        seq_id = self.chip_cells.get((offset.x, offset.y))
        if seq_id is not None:
            self.post_message(SeqSelected(seq_id))


def node_slots(box: tuple[int, int], rows: list[int]) -> list[tuple[int, int]]:
    """Chip cells inside a box: every other column, one column in from the left border."""
    left, right = box
    return [(x, y) for y in rows for x in range(left + 2, right, 2)]


def draw_box(canvas: Canvas, left: int, top: int, right: int, bottom: int, style: Style) -> None:
    canvas.put(left, top, "┌" + "─" * (right - left - 1) + "┐", style)
    for y in range(top + 1, bottom):
        canvas.put(left, y, "│", style)
        canvas.put(right, y, "│", style)
    canvas.put(left, bottom, "└" + "─" * (right - left - 1) + "┘", style)


def edge_path(edge: str, layout: Layout) -> list[tuple[int, int]]:
    admit_y, back_y = layout.prefill_rows[0], layout.decode_rows[-1]
    x0, x1 = layout.wait[1] - 2, layout.run[0] + 2
    if edge == "admit":
        return [(x, admit_y) for x in range(x0, x1 + 1)]
    if edge == "preempt":
        return [(x, back_y) for x in range(x1, x0 - 1, -1)]
    if edge == "finish":
        return [(x, layout.decode_rows[0]) for x in range(layout.run[1] - 2, layout.fin[0] + 3)]
    if edge == "done":
        x = layout.run[1] - 2
        return [(x, y) for y in range(layout.prefill_rows[0], layout.decode_rows[0] + 1)]
    return []
