"""`a` in the live app: type a prompt (and, optionally, max_tokens) for a request that joins the
running engine at its next step. Enter adds it, Tab moves between the two boxes, Esc cancels."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


@dataclass(slots=True)
class NewRequest:
    prompt: str
    max_tokens: int | None  # None: the run's own


class AddRequestScreen(ModalScreen[NewRequest | None]):
    CSS_PATH = "live.tcss"
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, default_max_tokens: int) -> None:
        super().__init__()
        self.default_max_tokens = default_max_tokens

    def compose(self) -> ComposeResult:
        with Vertical(id="add-box"):
            yield Label("Add a request: it joins the engine at the next step.")
            yield Label("Enter adds · Tab: max_tokens · Esc cancels", classes="dim")
            yield Input(placeholder="prompt", id="add-prompt")
            yield Input(placeholder=f"max_tokens (default {self.default_max_tokens})", type="integer", id="add-max")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        prompt = self.query_one("#add-prompt", Input).value
        max_text = self.query_one("#add-max", Input).value.strip()
        if not prompt.strip():
            self.notify("type a prompt first (Esc cancels)", severity="warning")
            self.query_one("#add-prompt", Input).focus()
            return
        try:
            max_tokens = int(max_text) if max_text else None
        except ValueError:
            self.notify("max_tokens is a whole number, or empty for the run's own", severity="error")
            return
        self.dismiss(NewRequest(prompt, max_tokens))

    def action_cancel(self) -> None:
        self.dismiss(None)
