"""The scheduler's queues as the step found them: the running list (admission order: the victim
policy preempts from its end) and the waiting queue (head first: a preempted request goes back to
the head, new requests join the tail). Fed one step line; memoryless.

    queues at the step's start  running A#0 B#1 C#2 (newest last)  │  waiting head→ ↩D#3 E#4

The rest of the screen shows the step's end, so a request this step admits is still listed as
waiting here, marked `+`.

`↩` marks a request preempted in the previous step (it jumped to the head), `✗` one this step
preempts, `+` one it admits: symbols, not only colour. A version-1 trace has no queues; the line
says so.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from nanoengine.sequence import EventKind
from tracer.i18n import N_, _
from tracer.replay.colors import DIM, seq_style, seq_tag

LABEL = "bold #c8d0da"


def queues_text(step: dict, prev: dict | None, width: int | None = None) -> Text:
    """The queue line; when `width` is too narrow for it, the labels shorten before any id is cut."""
    text = build_text(step, prev, LONG_LABELS)
    if width is not None and text.cell_len > width:
        text = build_text(step, prev, SHORT_LABELS)
    return text


LONG_LABELS = (N_("queues at the step's start  "), N_("running "), N_(" (newest last)"), "  │  ", N_("waiting head→ "))
SHORT_LABELS = (N_("at step start: "), N_("run "), "", " │ ", N_("wait head→ "))


def build_text(step: dict, prev: dict | None, labels: tuple[str, ...]) -> Text:
    title, running_label, newest_last, bar, waiting_label = (_(label) if label.strip() else label for label in labels)
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(title, LABEL)
    queues = step.get("queues")
    if queues is None:
        text.append(_("not recorded in this trace (schema version 1)"), DIM)
        return text
    kinds = {(e["kind"], e["seq_id"]) for e in step.get("events", [])}
    jumped = {e["seq_id"] for e in (prev or {}).get("events", []) if e["kind"] == EventKind.PREEMPTED}
    text.append(running_label, LABEL)
    append_ids(text, queues["running"], kinds, jumped)
    text.append(newest_last if queues["running"] else _("(empty)"), DIM)
    text.append(bar, DIM)
    text.append(waiting_label, LABEL)
    append_ids(text, queues["waiting"], kinds, jumped)
    if not queues["waiting"]:
        text.append(_("(empty)"), DIM)
    more = queues.get("num_waiting", 0) - len(queues["waiting"])
    if more > 0:
        text.append(" " + _("… +{count} more").format(count=more), DIM)
    return text


def append_ids(text: Text, seq_ids, kinds: set[tuple[str, int]], jumped: set[int]) -> None:
    for i, seq_id in enumerate(seq_ids):
        if i:
            text.append(" ")
        if seq_id in jumped:
            text.append("↩", "bold #ffd23f")
        if (EventKind.PREEMPTED, seq_id) in kinds:
            text.append("✗", "bold #ff6b6b")
        elif (EventKind.ADMITTED, seq_id) in kinds:
            text.append("+", "bold #90be6d")
        text.append(seq_tag(seq_id), seq_style(seq_id))


class QueuesView(Static):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.shown: tuple[dict, dict | None] | None = None

    def show(self, step: dict, prev: dict | None, header: dict) -> None:
        self.shown = (step, prev)
        self.update(queues_text(step, prev, self.content_size.width or None))

    def on_resize(self) -> None:
        if self.shown is not None:
            self.update(queues_text(*self.shown, self.content_size.width or None))
