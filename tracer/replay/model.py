"""The replay without a screen: which step is shown, where ←/→, Home/End, `g` and `n`/`p` go, what
is selected, and the second trace it is compared with. The TUI (app.py) draws it; the browser
replay (tracer/export) and `replay --text` read the same model. Nothing here imports Textual.

    model = ReplayModel(source, start=0, compare=None)   # source: a Trace, or a GrowingTrace
    model.current, model.previous, model.step_number     # the step shown, the one before, its number
    model.go_to(index)                                   # TraceError if that step cannot be shown
    model.event_from(+1 / -1) -> index | None            # the next / previous event step (n / p)
    model.index_of_number(step) -> (index, note)         # g: a step number to an index
    model.poll() -> new steps                            # a growing source (follow, live); model.following
    model.select(seq_id, block); model.selection
    model.compare_sides() -> (Side, Side)                # this step of both traces, for the diff panel
    model.beam_scores() -> {seq_id: cumulative logprob}  # a pruning's numbers, for narrate(..., scores)

A source is anything with what Trace holds (path, header, steps, marks, requests, warning); one
that also has poll() grows while it is shown (tracer/live/source.py: a file still being written).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tracer.i18n import _
from tracer.replay.beams import BeamScores, has_pruning
from tracer.replay.marks import is_event_step, step_mark
from tracer.trace.diff import Side, TraceDiff, diff_traces, null_blocks, request_order
from tracer.trace.trace_file import StepMarks, TraceError, check_step


class StepSource(Protocol):
    path: Path
    header: dict
    steps: Sequence[dict]
    marks: list[StepMarks]
    requests: dict[int, dict]
    warning: str | None


@dataclass(slots=True)
class Selection:
    seq: int | None = None
    block: int | None = None  # a block clicked in the KV pages (seq: one of its owners)


def viewer_header(source: Any) -> dict:
    """The header as the views read it: every request, including those added mid-run."""
    requests = getattr(source, "requests", None) or {}
    return dict(source.header, requests=list(requests.values()) or source.header.get("requests", []))


def focus_index(source: Any) -> int | None:
    """The index of the step a lesson or demo asks to open at (its header's focus_step), if any."""
    focus = source.header.get("focus_step")
    numbers = [marks.step for marks in source.marks]
    return numbers.index(focus) if isinstance(focus, int) and focus in numbers else None


class ReplayModel:
    def __init__(self, source: StepSource, start: int = 0, compare: StepSource | None = None) -> None:
        """compare: a second run of the same workload (DiffError if it is not one)."""
        self.source = source
        self.header = viewer_header(source)
        # grown in place as a growing source gets steps: the timeline holds these same lists
        self.step_numbers: list[int] = []
        self.marks: list[str] = []
        self.event_indices: list[int] = []
        self.take_marks()
        self.index = self.clamp(start)
        self.selection = Selection()
        self.compare = compare
        self.diff: TraceDiff | None = diff_traces(source, compare) if compare is not None else None
        self.checked: set[int] = set()  # step indices validated against the schema
        self.following = True  # a growing source: show each new step as it arrives
        self.broken = ""  # why a growing source can no longer be followed
        self.scores = BeamScores()

    # ---- the step shown ---------------------------------------------------------------------
    @property
    def steps(self) -> Sequence[dict]:
        return self.source.steps  # a list, or LazySteps / GrowingSteps parsing each step when first shown

    @property
    def last(self) -> int:
        return len(self.steps) - 1

    @property
    def at_newest(self) -> bool:
        return self.index >= self.last

    @property
    def current(self) -> dict:
        return self.steps[self.index]

    @property
    def previous(self) -> dict | None:
        return self.steps[self.index - 1] if self.index > 0 else None

    @property
    def step_number(self) -> int:
        return self.step_numbers[self.index]

    def clamp(self, index: int) -> int:
        return max(0, min(index, self.last))

    def check(self, index: int) -> None:
        """Validate a step against the schema the first time it is shown (a TraceError names the field)."""
        if index not in self.checked:
            check_step(self.source, index)  # type: ignore[arg-type]  # it reads what a GrowingTrace has too
            self.checked.add(index)

    def go_to(self, index: int) -> bool:
        """Show step index (clamped); False if that is the step shown. TraceError (one line) when it,
        or the step before it, cannot be read or breaks the schema: the step shown stays."""
        index = self.clamp(index)
        try:
            if index == self.index:
                return False
            self.check(index)
            self.check(max(0, index - 1))
            self.index = index
            return True
        finally:
            self.following = self.at_newest  # browsing history stops following; reaching the newest resumes

    def event_from(self, direction: int) -> int | None:
        """The next (direction > 0) or previous event step's index, None if there is none."""
        if direction > 0:
            i = bisect.bisect_right(self.event_indices, self.index)
            return self.event_indices[i] if i < len(self.event_indices) else None
        i = bisect.bisect_left(self.event_indices, self.index)
        return self.event_indices[i - 1] if i > 0 else None

    def index_of_number(self, number: int) -> tuple[int, str]:
        """The index of step `number`, or of the nearest step after it, and what to tell the user
        when it is not that step ('' when it is)."""
        index = bisect.bisect_left(self.step_numbers, number)
        if index >= len(self.step_numbers):
            return self.last, _("step {number} is past the end; showing the last step").format(number=number)
        if self.step_numbers[index] != number:
            return index, _("no step {number} in this trace; showing step {shown}").format(
                number=number, shown=self.step_numbers[index]
            )
        return index, ""

    def beam_scores(self) -> dict[int, float]:
        """Each beam's cumulative logprob after the step shown, where a beam was pruned in it (the
        narration's numbers; summing reads the search's earlier steps, so only then); else {}."""
        return self.scores.at(self.steps, self.index) if has_pruning(self.current) else {}

    # ---- a growing source ---------------------------------------------------------------------
    @property
    def grows(self) -> bool:
        return hasattr(self.source, "poll")

    def poll(self) -> int:
        """Read a growing source's new steps; the number read. TraceError when the file can no longer
        be followed (damaged, or rewritten): self.broken keeps why, and nothing more is read."""
        if self.broken or not self.grows:
            return 0
        try:
            new: int = self.source.poll()  # type: ignore[attr-defined]
        except TraceError as e:
            self.broken = str(e)
            raise
        if new:
            self.take_marks()
        return new

    def take_marks(self) -> None:
        """The timeline's marks and n / p's stops for the steps not taken yet; requests added since."""
        for index in range(len(self.step_numbers), len(self.source.marks)):
            marks = self.source.marks[index]
            self.step_numbers.append(marks.step)
            self.marks.append(step_mark(marks))
            if is_event_step(marks):
                self.event_indices.append(index)
        requests = getattr(self.source, "requests", None) or {}
        if requests and len(self.header["requests"]) != len(requests):
            self.header["requests"] = list(requests.values())

    def show_newest(self) -> None:
        """Move to the newest step and follow. It is parsed (a TraceError keeps the step shown and
        sets self.broken) but not validated against the whole schema as a step browsed to is: a big
        pool's arrays take jsonschema a second a step, and a nanoengine recorder wrote it a moment ago."""
        try:
            self.steps[self.last]
        except TraceError as e:
            self.broken = str(e)
            raise
        self.index = self.last
        self.following = True

    # ---- selection and comparison ---------------------------------------------------------------
    def select(self, seq_id: int | None, block: int | None = None) -> None:
        self.selection = Selection(seq_id, block)

    def owner_to_select(self, owners: Sequence[int]) -> int | None:
        """A clicked block's sequence: the selected one if it is an owner, else its first owner."""
        return self.selection.seq if self.selection.seq in owners else (owners[0] if owners else None)

    def compare_sides(self) -> tuple[Side, Side]:
        """The step shown and the same step of the compared trace (None past its end), by request index."""
        assert self.compare is not None
        i, other = self.index, self.compare.steps
        mine = Side(self.source, self.current, request_order(self.source), null_blocks(self.source), self.previous)
        theirs = Side(
            self.compare,
            other[i] if i < len(other) else None,
            request_order(self.compare),
            null_blocks(self.compare),
            other[i - 1] if 0 < i <= len(other) else None,
        )
        return mine, theirs
