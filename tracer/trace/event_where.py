"""Where each scheduler event was emitted: the engine lines behind it, noted as it is created.

While a recorder listens, SchedulerOutput.add_event is wrapped (the engine's own code unchanged,
as tracer/teach/swap.py swaps lesson functions): each call notes the (code, line) of the function
that called add_event and of its two callers, innermost first, keyed by the event's detail dict
(the StepEvent a step hook gets holds that same dict). The recorder takes the notes of its step's
events; the last recorder to stop listening restores add_event and drops what is left.

    listen() / stop_listening()       refcounted: one wrapper however many recorders listen
    taken(detail) -> [(code, line), ...]    and forgotten; [] if none was noted
"""

from __future__ import annotations

import sys
import threading
from itertools import islice
from traceback import walk_stack
from types import CodeType
from typing import Any

from nanoengine.scheduler import SchedulerOutput

DEPTH = 3  # the emitting function and two callers: make_room -> preempt -> add_event
MAX_NOTES = 4096  # events of engines no recorder listens to are dropped past this
ORIGINAL = SchedulerOutput.add_event
NOTES: dict[int, tuple[dict, list[tuple[CodeType, int]]]] = {}  # id(detail) -> (detail, frames)
LOCK = threading.Lock()
listeners = 0


def add_event_noting_where(self: SchedulerOutput, kind: Any, seq: Any, **detail: Any) -> None:
    ORIGINAL(self, kind, seq, **detail)
    stored = self.events[-1][2]  # the dict the engine keeps (the note holds it: its id stays its own)
    if len(NOTES) >= MAX_NOTES:
        NOTES.clear()
    NOTES[id(stored)] = (stored, [(f.f_code, line) for f, line in islice(walk_stack(sys._getframe(1)), DEPTH)])


def listen() -> None:
    global listeners
    with LOCK:
        listeners += 1
        SchedulerOutput.add_event = add_event_noting_where  # type: ignore[method-assign]


def stop_listening() -> None:
    global listeners
    with LOCK:
        listeners = max(0, listeners - 1)
        if listeners == 0:
            SchedulerOutput.add_event = ORIGINAL  # type: ignore[method-assign]
            NOTES.clear()


def taken(detail: dict) -> list[tuple[CodeType, int]]:
    note = NOTES.pop(id(detail), None)
    return note[1] if note is not None and note[0] is detail else []
