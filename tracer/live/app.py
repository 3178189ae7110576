"""The live app: the replay following a running engine's trace, with the engine's controls.

    LiveApp(source: GrowingTrace, control: EngineControl)

Keys beyond the replay's (`?` lists them): space pauses / resumes the ENGINE; → at the newest step
of a paused engine runs exactly one engine step; `a` adds a request; `x` aborts the selected
sequence; End follows the newest step again. ←, g and n/p browse history while the engine runs.
The app never waits for the engine: commands go on the loop's queue, steps are read from the trace
file on a timer, and the loop's answers (a refused request, a violation) come back as notices.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.binding import Binding

from tracer.live.add_screen import AddRequestScreen, NewRequest
from tracer.live.control import EngineControl
from tracer.live.follow import REPLAY_CSS, FollowApp
from tracer.live.source import GrowingTrace
from tracer.replay.help import HelpScreen

LIVE_CSS = Path(__file__).with_name("live.tcss")
LIVE_KEYS = (
    "Live keys (the engine runs while you watch)",
    (
        ("space", "pause / resume the engine (a server's HTTP streams wait while it is paused)"),
        ("→ at the newest step", "while paused: run exactly one engine step"),
        ("a", "add a request (a prompt, optionally max_tokens): it joins at the next step"),
        ("x", "abort the selected sequence: FINISHED (abort) at the next step, its blocks freed"),
        ("← / g / n / p", "browse history while the engine keeps going"),
        ("End", "follow the newest step again"),
        ("q", "quit: stops the engine and closes the trace (replayable, checkable)"),
    ),
)


class LiveApp(FollowApp):
    CSS_PATH = [str(REPLAY_CSS), str(LIVE_CSS)]  # type: ignore[assignment]
    TITLE = "nanoengine live"
    BINDINGS = [
        Binding("space", "toggle_engine", "pause/resume engine", priority=True),
        Binding("a", "add_request", "add request"),
        Binding("x", "abort_selected", "abort seq"),
    ]
    FOLLOW_ACTIONS = frozenset({"follow", "toggle_engine", "add_request", "abort_selected"})

    def __init__(self, source: GrowingTrace, control: EngineControl, **kwargs) -> None:
        super().__init__(source, **kwargs)
        self.control = control
        self.shown_state = ""

    def poll(self) -> None:
        super().poll()
        for severity, message in self.control.take_notices():
            self.notify(message, severity=severity, timeout=10 if severity == "error" else 5, markup=False)  # type: ignore[arg-type]
        state = self.control.state()
        if state != self.shown_state:
            self.shown_state = state
            self.update_status()
            self.update_topbar()

    # ---- engine control ---------------------------------------------------------------------
    def action_toggle_engine(self) -> None:
        self.control.toggle_pause()
        self.shown_state = self.control.state()
        self.update_status()
        self.update_topbar()

    def action_step(self, delta: int) -> None:
        at_newest = self.step_index >= len(self.steps) - 1
        if delta > 0 and at_newest and self.control.paused:
            self.following = True
            self.control.step_once()
            return
        super().action_step(delta)

    def action_add_request(self) -> None:
        self.push_screen(AddRequestScreen(self.control.params.max_tokens), self.add_request)

    def add_request(self, new: NewRequest | None) -> None:
        if new is None:
            return
        try:
            self.control.add(new.prompt, new.max_tokens)
        except ValueError as e:
            self.notify(f"request not added: {e}", severity="error", timeout=10, markup=False)
            return
        self.notify("request added: it joins at the next step", timeout=4)

    def action_abort_selected(self) -> None:
        if self.selected_seq is None:
            self.notify("select a sequence first (↑/↓ in the sequences panel, or click it), then x", severity="warning")
            return
        self.control.abort(self.selected_seq)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(LIVE_KEYS))

    # ---- what the screen says -----------------------------------------------------------------
    def status_text(self) -> str:
        return f"{super().status_text()} · {self.control.state()}"

    def badge(self) -> Text:
        if self.control.paused and not self.control.stopped:
            return Text(" ● LIVE ‖ PAUSED ", "bold black on #ffd23f")
        return Text(" ● LIVE ", "bold white on #c0392b")

    def waiting_text(self) -> str:
        return "Waiting for the engine's first step (a request arrives, or `a` adds one) ..."
