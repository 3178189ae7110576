"""The replay over a trace that is still being written: the timeline grows and the view follows the
newest step, like `tail -f` (`nanoengine replay --follow FILE`; the live app builds on it).

    FollowApp(source: GrowingTrace)      source.poll() already read its header

←, g, n/p browse history while the file keeps growing; End (or reaching the newest step) follows
again. The app reads the file on a timer and never waits for the writer.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.binding import Binding
from textual.content import Content
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Static

from tracer.live.source import GrowingTrace
from tracer.replay import app as replay_app
from tracer.replay.app import ReplayApp, is_event_step
from tracer.replay.views.timeline import TimelineView, step_mark
from tracer.trace.trace_file import TraceError

POLL_S = 0.1  # how often the file is read for new steps (a few stat calls a second when nothing changed)
REPLAY_CSS = Path(replay_app.__file__).with_name("app.tcss")


class FollowApp(ReplayApp):
    CSS_PATH = str(REPLAY_CSS)
    TITLE = "nanoengine replay --follow"
    BINDINGS = [Binding("end", "follow", "follow", key_display="End", priority=True)]
    FOLLOW_ACTIONS = frozenset({"follow"})

    def __init__(self, source: GrowingTrace, **kwargs) -> None:
        super().__init__(source, max(0, len(source.steps) - 1), **kwargs)  # opens at the newest step
        self.source = source
        self.following = True  # show each new step as it arrives
        self.poll_timer: Timer | None = None
        self.broken = ""  # why the file can no longer be followed

    def on_mount(self) -> None:
        super().on_mount()
        self.poll_timer = self.set_interval(POLL_S, self.poll)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.FOLLOW_ACTIONS and isinstance(self.screen, ModalScreen):
            return False
        return super().check_action(action, parameters)

    # ---- reading the file -----------------------------------------------------------------
    def poll(self) -> None:
        """Take the steps appended since the last poll; follow the newest if following."""
        if self.broken or not self.query(TimelineView):
            return  # broken, or the app is closing and its views are gone: the steps stay unread
        try:
            new = self.source.poll()
        except TraceError as e:
            self.broken = str(e)
            self.notify(self.broken, title="stopped following", severity="error", timeout=30, markup=False)
            self.update_status()
            return
        if new:
            self.take_steps(new)

    def take_steps(self, new: int) -> None:
        for index in range(len(self.step_numbers), len(self.step_numbers) + new):
            marks = self.source.marks[index]
            self.step_numbers.append(marks.step)
            self.marks.append(step_mark(marks.kinds, marks.has_violations))
            if is_event_step(marks):
                self.event_indices.append(index)
        if len(self.header["requests"]) != len(self.source.requests):
            self.header["requests"] = list(self.source.requests.values())
        self.query_one(TimelineView).grow()
        if self.following:
            self.follow_newest()
        else:
            self.update_status()

    def follow_newest(self) -> None:
        """Show the newest step. It is parsed and its fields checked, but not validated against the
        whole schema as a step browsed to is: a big pool's arrays take jsonschema a second a step,
        and a nanoengine recorder wrote it a moment ago."""
        last = len(self.steps) - 1
        try:
            self.steps[last]
        except TraceError as e:
            self.broken = str(e)
            self.notify(self.broken, title="stopped following", severity="error", timeout=30, markup=False)
            return
        if last == self.step_index:
            self.show_step()  # the first step of an empty trace
        else:
            self.step_index = last  # redraws
        self.following = True

    # ---- following and browsing -------------------------------------------------------------
    def go_to(self, index: int) -> None:
        super().go_to(index)
        self.following = self.step_index >= len(self.steps) - 1

    def action_follow(self) -> None:
        self.following = True
        self.playing = False
        if self.steps:
            ReplayApp.go_to(self, len(self.steps) - 1)
        self.update_status()

    def show_step(self) -> None:
        if not self.steps:
            self.query_one("#narration", Static).update(Content(self.waiting_text()))
            self.update_status()
            return
        super().show_step()

    def waiting_text(self) -> str:
        return f"Waiting for the first step of {self.source.path.name} ..."

    def update_status(self) -> None:
        self.query_one(TimelineView).show_position(self.step_index, self.status_text())

    def status_text(self) -> str:
        if self.broken:
            return "✗ stopped following (the file is damaged or was rewritten)"
        if self.following:
            return "● following the newest step"
        return "◼ browsing history (End: follow the newest step)"

    def badge(self) -> Text:
        return Text(" ● FOLLOW ", "bold black on #ffd23f")

    def action_goto(self) -> None:
        if self.steps:
            super().action_goto()

    def action_screenshot(self) -> None:  # type: ignore[override]
        if self.steps:
            super().action_screenshot()

    def action_toggle_play(self) -> None:
        if self.steps:
            super().action_toggle_play()


def followed_path(path: Path) -> Path:
    """The file to follow: path, or the server's path.partial while it is still recording into it."""
    partial = path.with_name(path.name + ".partial")
    return partial if not path.exists() and partial.exists() else path


def wait_for_header(source: GrowingTrace, say) -> None:
    """Poll until the header line is complete (a recorder writes it at its first step)."""
    import time

    if source.poll() or source.has_header:
        return
    say(f"waiting for {source.path} to get its first line (Ctrl-C to stop) ...")
    while not source.has_header:
        time.sleep(POLL_S)
        source.poll()


def run_follow(path: str | Path) -> int:
    """`nanoengine replay --follow FILE`: open the replay on a trace another process is writing."""
    import os
    import sys

    def say(message: str) -> None:
        print(f"nanoengine: {message}", file=sys.stderr, flush=True)

    try:
        source = GrowingTrace(followed_path(Path(path)))
    except TraceError as e:
        say(f"error: {e}")
        return 2
    if not (sys.stdin.isatty() and sys.stdout.isatty()) and "TEXTUAL_DRIVER" not in os.environ:
        source.close()
        say(f"error: --follow needs an interactive terminal; `nanoengine check {path}` reads the file as it is")
        return 2
    try:
        wait_for_header(source, say)
    except (TraceError, KeyboardInterrupt) as e:
        source.close()
        if isinstance(e, KeyboardInterrupt):
            return 130
        say(f"error: {e}")
        return 2
    try:
        app = FollowApp(source)
        result = app.run()
    finally:
        source.close()
    if app.failure:
        say(f"error: {app.failure}"[:400])
    return app.return_code or result or 0
