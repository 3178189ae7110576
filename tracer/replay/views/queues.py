"""The scheduler's queues as the step found them: the running list (admission order: the victim
policy preempts from its end) and the waiting queue (head first: a preempted request goes back to
the head, new requests join the tail). Fed one step line; memoryless.

    queues  running A#0 B#1 C#2 (newest last)  │  waiting head→ ↩D#3 E#4

`↩` marks a request preempted in the previous step (it jumped to the head), `✗` one this step
preempts, `+` one it admits: symbols, not only colour. A version-1 trace has no queues; the line
says so.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tracer.replay.colors import DIM, seq_style, seq_tag

LABEL = "bold #c8d0da"


def queues_text(step: dict, prev: dict | None) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("queues  ", LABEL)
    queues = step.get("queues")
    if queues is None:
        text.append("not recorded in this trace (schema version 1)", DIM)
        return text
    kinds = {(e["kind"], e["seq_id"]) for e in step.get("events", [])}
    jumped = {e["seq_id"] for e in (prev or {}).get("events", []) if e["kind"] == "preempted"}
    text.append("running ", LABEL)
    append_ids(text, queues["running"], kinds, jumped)
    text.append(" (newest last)" if queues["running"] else "(empty)", DIM)
    text.append("  │  ", DIM)
    text.append("waiting head→ ", LABEL)
    append_ids(text, queues["waiting"], kinds, jumped)
    if not queues["waiting"]:
        text.append("(empty)", DIM)
    more = queues.get("num_waiting", 0) - len(queues["waiting"])
    if more > 0:
        text.append(f" … +{more} more", DIM)
    return text


def append_ids(text: Text, seq_ids, kinds: set[tuple[str, int]], jumped: set[int]) -> None:
    for i, seq_id in enumerate(seq_ids):
        if i:
            text.append(" ")
        if seq_id in jumped:
            text.append("↩", "bold #ffd23f")
        if ("preempted", seq_id) in kinds:
            text.append("✗", "bold #ff6b6b")
        elif ("admitted", seq_id) in kinds:
            text.append("+", "bold #90be6d")
        text.append(seq_tag(seq_id), seq_style(seq_id))


class QueuesView(Static):
    def show(self, step: dict, prev: dict | None, header: dict) -> None:
        self.update(queues_text(step, prev))
