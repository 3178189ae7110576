"""'step N of M', a clickable scrubber across the whole trace, and event markers on it."""

from __future__ import annotations

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from nanoengine.sequence import EventKind
from tracer.i18n import N_, _
from tracer.replay.colors import EVENT_MARKS
from tracer.replay.marks import MARK_ORDER

PLAYED = Style(color="#2ec4b6")
AHEAD = Style(color="#6c6c6c")
CURSOR = Style(color="black", bgcolor="#ffd23f", bold=True)
BOLD = Style(bold=True)
LEGEND = (
    (EventKind.PREEMPTED, N_("preempt")),
    (EventKind.PREFIX_HIT, N_("prefix hit")),
    (EventKind.FINISHED, N_("finish")),
    ("violation", N_("violation")),
)


class TimelineView(Widget):
    """Two lines: the scrubber with markers, then the step counter, playback state and legend."""

    class Seek(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, marks: list[str], step_numbers: list[int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.marks = marks
        self.step_numbers = step_numbers
        self.index = 0
        self.status = ""
        self.bar_cache: tuple[int, list[str]] | None = None

    def show_position(self, index: int, status: str) -> None:
        self.index, self.status = index, status
        self.refresh()

    def grow(self) -> None:
        """Steps were appended to marks and step_numbers (a trace still being written): redraw the bar."""
        self.bar_cache = None
        self.refresh()

    def column_marks(self, width: int) -> list[str]:
        """The marker kind of each scrubber column, cached per width (markers never change)."""
        if self.bar_cache and self.bar_cache[0] == width:
            return self.bar_cache[1]
        columns = [""] * width
        for index, kind in enumerate(self.marks):
            if kind:
                column = self.column_of(index, width)
                if not columns[column] or MARK_ORDER.index(kind) < MARK_ORDER.index(columns[column]):
                    columns[column] = kind
        self.bar_cache = (width, columns)
        return columns

    def column_of(self, index: int, width: int) -> int:
        """The nearest column: the first step at the left end of the bar, the last at the right end."""
        last = len(self.marks) - 1
        if last <= 0:
            return 0
        return (2 * index * (width - 1) + last) // (2 * last)

    def index_at(self, column: int, width: int) -> int:
        """The step nearest to a column (the inverse of column_of)."""
        last = len(self.marks) - 1
        if last <= 0 or width <= 1:
            return 0
        return max(0, min(last, (2 * column * last + width - 1) // (2 * (width - 1))))

    def render_line(self, y: int) -> Strip:
        width = max(1, self.content_size.width)
        if y == 0:
            return Strip(self.bar_segments(width), width).crop(0, width)
        if y > 1:
            return Strip.blank(width)
        first = self.step_numbers[0] if self.step_numbers else 0
        last = self.step_numbers[-1] if self.step_numbers else 0
        number = self.step_numbers[self.index] if self.step_numbers else 0
        # "step 5 of 0–5": the range shows steps count from 0 (a 6-step trace ends at step 5)
        position = _("step {number} of {first}–{last}").format(number=number, first=first, last=last)
        segments = [Segment(position, BOLD), Segment(f"  {self.status}  ")]
        used = sum(cell_len(s.text) for s in segments)  # cells: a Chinese character takes two
        for kind, label in LEGEND:
            label = _(label)
            if used + cell_len(label) + 2 > width:  # a whole legend entry or none
                break
            char, style = EVENT_MARKS[kind]
            segments += [Segment(char, Style.parse(style)), Segment(f" {label}  ", AHEAD)]
            used += cell_len(label) + 4
        return Strip(segments).extend_cell_length(width).crop(0, width)

    def bar_segments(self, width: int) -> list[Segment]:
        """The scrubber: played part, markers, the cursor, the rest."""
        current = self.column_of(self.index, width)
        segments = []
        for column, kind in enumerate(self.column_marks(width)):
            if column == current:
                segments.append(Segment("●", CURSOR))
            elif kind:
                char, style = EVENT_MARKS[kind]
                segments.append(Segment(char, Style.parse(style)))
            else:
                segments.append(Segment("━" if column < current else "─", PLAYED if column < current else AHEAD))
        return list(Segment.simplify(segments))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is not None and offset.y == 0:
            self.post_message(self.Seek(self.index_at(offset.x, max(1, self.content_size.width))))
