"""The `v` screen: every invariant violation at the step, in full, each with its invariant's rule,
the cell it is about and the engine function it checks (from the trace's sources); Enter shows
that function in the code panel.

    ✗ preempt_resets · C#2 · cell: num_cached_tokens
      rule: a preempted sequence ends the step WAITING with no blocks and num_cached_tokens 0
      seq 2 was preempted but ends the step with num_cached_tokens = 13 and blocks []; ...
      code: Scheduler.preempt — 12_bughunt_stale_cached_count/exercise.py:19 (swapped in: your code)
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList

from tracer.i18n import N_, ngettext
from tracer.replay.colors import VIOLATION
from tracer.replay.decision_code import violation_lines


def violation_entry(violation: dict, sources: dict) -> Text:
    """One violation as the list shows it: violation_lines, styled (rich reads no markup in it)."""
    head, rule, message, code = violation_lines(violation, sources)
    name, _sep, rest = head.partition(" · ")
    text = Text(name, VIOLATION)
    text.append(f" · {rest}" if rest else "", "bold")
    text.append(f"\n{rule}", "#a0a0a0")
    text.append(f"\n{message}")
    text.append(f"\n{code}", "#8ab4f8")
    return text


class ViolationsScreen(ModalScreen[int | None]):
    """Dismissed with the index (into `violations`) of the one to show the code of, or None."""

    BINDINGS = [Binding("escape,v", "close", N_("close"))]

    def __init__(self, step_number: int, violations: list[dict], sources: dict) -> None:
        super().__init__()
        self.step_number, self.violations, self.sources = step_number, violations, sources

    def compose(self) -> ComposeResult:
        n = len(self.violations)
        with Vertical(id="violations-box"):
            title = ngettext(
                "{count} invariant violation at step {step} · Enter: its code in the code panel · Esc: close",
                "{count} invariant violations at step {step} · Enter: its code in the code panel · Esc: close",
                n,
            )
            yield Label(title.format(count=n, step=self.step_number), id="violations-title")
            yield OptionList(*(violation_entry(v, self.sources) for v in self.violations), id="violations-list")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option_index)

    def action_close(self) -> None:
        self.dismiss(None)
