"""The live app: the replay app over a running engine's trace file, with the engine's controls.

    live_app(source: GrowingTrace, control: EngineControl) -> ReplayApp
    LiveControls(control)        what the engine adds to the replay: its keys, notices and status

Keys beyond the replay's (`?` lists them): space pauses / resumes the ENGINE; → at the newest step
of a paused engine runs exactly one engine step; `a` adds a request; `x` aborts the selected
sequence; End follows the newest step again. ←, g and n/p browse history while the engine runs.
The app never waits for the engine: commands go on the loop's queue, steps are read from the trace
file on a timer (the replay follows a growing source), and the loop's answers (a refused request,
a violation) come back as notices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from tracer.live.add_screen import AddRequestScreen, NewRequest
from tracer.live.control import EngineControl
from tracer.live.source import GrowingTrace
from tracer.replay.app import ReplayApp
from tracer.replay.controls import HelpKeys

if TYPE_CHECKING:
    from textual.app import App

LIVE_KEYS: HelpKeys = (
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


def live_app(source: GrowingTrace, control: EngineControl, **kwargs) -> ReplayApp:
    """The replay following source (source.poll() already read its header), driving control's engine."""
    return ReplayApp(source, max(0, len(source.steps) - 1), live=LiveControls(control), **kwargs)


class LiveControls:
    """The engine's side of the live app; ReplayApp calls it from its keys and its poll timer."""

    HELP: HelpKeys = LIVE_KEYS
    WAITING = "Waiting for the engine's first step (a request arrives, or `a` adds one) ..."

    def __init__(self, control: EngineControl) -> None:
        self.control = control
        self.shown_state = ""  # the engine state last shown: a change redraws the status and the badge

    # ---- what the screen says -----------------------------------------------------------------
    def status(self) -> str:
        return self.control.state()

    def badge(self) -> Text:
        if self.control.paused and not self.control.stopped:
            return Text(" ● LIVE ‖ PAUSED ", "bold black on #ffd23f")
        return Text(" ● LIVE ", "bold white on #c0392b")

    def after_poll(self, app: ReplayApp) -> None:
        """The loop's notices as toasts; a changed engine state redrawn."""
        for severity, message in self.control.take_notices():
            app.notify(message, severity=severity, timeout=10 if severity == "error" else 5, markup=False)  # type: ignore[arg-type]
        if self.control.state() != self.shown_state:
            self.show_state(app)

    def show_state(self, app: ReplayApp) -> None:
        self.shown_state = self.control.state()
        app.update_status()
        app.update_topbar()

    # ---- the keys -----------------------------------------------------------------------------
    def toggle_engine(self, app: ReplayApp) -> None:
        self.control.toggle_pause()
        self.show_state(app)

    def step_engine(self) -> bool:
        """→ at the newest step: a paused engine runs exactly one step (True); else the replay steps."""
        if not self.control.paused:
            return False
        self.control.step_once()
        return True

    def ask_for_request(self, app: App) -> None:
        app.push_screen(AddRequestScreen(self.control.params.max_tokens), lambda new: self.add_request(app, new))

    def add_request(self, app: App, new: NewRequest | None) -> None:
        if new is None:
            return
        try:
            self.control.add(new.prompt, new.max_tokens)
        except ValueError as e:
            app.notify(f"request not added: {e}", severity="error", timeout=10, markup=False)
            return
        app.notify("request added: it joins at the next step", timeout=4)

    def abort_selected(self, app: ReplayApp) -> None:
        if app.selected_seq is None:
            app.notify("select a sequence first (↑/↓ in the sequences panel, or click it), then x", severity="warning")
            return
        self.control.abort(app.selected_seq)
