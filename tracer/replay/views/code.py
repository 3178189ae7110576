"""The code panel (`c`): the engine function behind the step's event (the selected sequence's, when
one is selected), or behind the step's phase, from the trace's own sources; at a step with
invariant violations, the function the chosen (else the clearest) violation's invariant checks; syntax-highlighted with
Textual's highlighter, the deciding lines marked ▶ (not by colour alone) and scrolled into view;
vLLM v1's counterpart on the line under the title. Fed a step; memoryless (what it shows is
decision_code(step, header, selected sequence)).

    PREEMPTED C#2 · decided in Scheduler.make_room, line 85
    vLLM v1: in Scheduler.schedule: KVCacheManager.allocate_slots fails → ...
    ── Scheduler.make_room — nanoengine/scheduler.py:79 (the engine's) · decided, called it
    ▶  85 │             self.preempt(victim, out, needed_by=seq)

▶ marks the deciding line, › the other lines of the call chain (decision_code.py).
"""

from __future__ import annotations

from textual.containers import ScrollableContainer, Vertical
from textual.content import Content
from textual.highlight import highlight
from textual.widgets import Static

from tracer.replay.decision_code import DecisionCode, Section, decision_code, marker, ordered_violations

MARK = "bold $warning"
HEADING = "bold $text-primary"


class CodeView(Vertical, can_focus=True):
    """The title and vLLM v1 line stay put; the code under them scrolls (arrows, mouse)."""

    DEFAULT_CSS = """
    CodeView > #code-title { height: auto; max-height: 2; text-wrap: nowrap; text-overflow: ellipsis; }
    CodeView > ScrollableContainer { height: 1fr; }
    CodeView #code-text { width: auto; text-wrap: nowrap; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step: dict = {}
        self.header: dict = {}
        self.seq_id: int | None = None
        self.violation: dict | None = None  # chosen in the violations list (v); reset by the next step
        self.code = DecisionCode("", "")

    def compose(self):
        yield Static(id="code-title")
        with ScrollableContainer(can_focus=False):
            yield Static(id="code-text")

    def show(self, step: dict, prev: dict | None, header: dict) -> None:
        self.step, self.header, self.violation = step, header, None
        self.redraw()

    def select(self, seq_id: int | None) -> None:
        self.seq_id, self.violation = seq_id, None
        self.redraw()

    def select_violation(self, violation: dict | None) -> None:
        self.violation = violation
        self.redraw()

    def redraw(self) -> None:
        violation = self.violation
        if violation is None and self.seq_id is None:
            violation = next(iter(ordered_violations(self.step)), None)
        self.code = decision_code(self.step, self.header, self.seq_id, violation)
        self.query_one("#code-title", Static).update(render_title(self.code))
        content, focus_row = render_code(self.code)
        self.query_one("#code-text", Static).update(content)
        self.call_after_refresh(self.scroll_to_row, focus_row or 0)

    def scroll_to_row(self, row: int) -> None:
        """The deciding line in view, with up to 3 lines of context above it: fewer when the panel
        is short (a few rows below 44 rows of terminal), so the ▶ line is never scrolled off."""
        body = self.query_one(ScrollableContainer)
        context = min(3, max(0, (body.scrollable_content_region.height - 1) // 2))
        body.scroll_to(x=0, y=max(0, row - context), animate=False)


def render_title(code: DecisionCode) -> Content:
    rows = [Content.styled(code.title, "bold")]
    if code.vllm:
        rows.append(Content.styled(code.vllm, "$text-muted"))
    return Content("\n").join(rows)


def render_code(code: DecisionCode) -> tuple[Content, int | None]:
    """The code under the title, and the row of the line to scroll to."""
    rows: list[Content] = []
    if code.note:
        rows.append(Content.styled(code.note, "italic $text-muted"))
    focus = code.focus
    focus_row = None
    for index, section in enumerate(code.sections):
        rows.append(Content.styled(f"── {section.heading}", HEADING))
        if focus is not None and focus[0] == index:
            focus_row = len(rows) + focus[1]
        rows.extend(section_rows(section))
    return Content("\n").join(rows), focus_row


def section_rows(section: Section) -> list[Content]:
    width = len(str(section.first_line + len(section.lines)))
    highlighted = highlight(section.source.rstrip("\n"), language="python").split("\n")
    rows = []
    for i, line in enumerate(highlighted):
        number = section.first_line + i
        if number in section.marked:
            mark = marker(section, number)
            rows.append(Content.assemble((f"{mark} {number:>{width}} │ ", MARK), line.stylize("bold")))
        else:
            rows.append(Content.assemble((f"  {number:>{width}} │ ", "$text-muted"), line))
    return rows
