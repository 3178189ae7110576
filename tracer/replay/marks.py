"""What a step is marked with, read from its StepMarks alone (no step parsed): the stops of `n` / `p`
and the timeline's marker. The replay TUI and the browser replay share them.

    is_event_step(marks) -> bool      a stop of n / p
    step_mark(marks) -> str           the timeline's marker kind ('' for none)
"""

from __future__ import annotations

from nanoengine.sequence import EventKind
from tracer.trace.trace_file import StepMarks

# the steps `n` and `p` stop at: not a chunk, nor a wait (not_admitted changes nothing; a long wait
# would stop at every step)
EVENT_KINDS = frozenset(EventKind) - {EventKind.PREFILL_CHUNK, EventKind.NOT_ADMITTED}
MARK_ORDER = ("violation", EventKind.PREEMPTED, EventKind.PREFIX_HIT, EventKind.FINISHED)  # most important first


def is_event_step(marks: StepMarks) -> bool:
    """Steps `n` / `p` stop at: a state change, a prefix hit, or a violation."""
    return marks.has_violations or bool(marks.kinds & EVENT_KINDS)


def step_mark(marks: StepMarks) -> str:
    """The most important marker of a step, from its event kinds ('' if none)."""
    if marks.has_violations:
        return "violation"
    return next((kind for kind in MARK_ORDER if kind in marks.kinds), "")
