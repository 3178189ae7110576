"""The replay TUI: step through a recorded trace and see the scheduler, the KV pool and the batch.

    run_replay(path, start_step=0, predict=False) -> exit code      (`nanoengine replay FILE`)
    ReplayApp(trace, start_step=0, predict=False)                   (tests, lessons)
    ReplayApp(growing_trace, last, live=LiveControls(control))      (follow and live: tracer/live)

The app is a view over a ReplayModel (model.py: the step shown, navigation, selection, comparison).
Every view is redrawn from one step dict (plus the previous one, for "what changed"), so stepping
back or jumping anywhere costs the same as stepping forward. A source that grows (a file still
being written) is read on a timer and followed; live controls add the engine's keys.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import var
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Footer, Input, Label, Static

from tracer.i18n import N_, _, ngettext
from tracer.replay.colors import VIOLATION, seq_tag
from tracer.replay.controls import EngineControls
from tracer.replay.decision_code import ordered_violations
from tracer.replay.help import HelpScreen
from tracer.replay.messages import SeqSelected
from tracer.replay.model import ReplayModel, focus_index, viewer_header
from tracer.replay.narration import narrate
from tracer.replay.predict import PredictScreen, Quiz, predict_start
from tracer.replay.svg_cells import fit_wide_text
from tracer.replay.views.banner import Banner
from tracer.replay.views.batch import BatchView
from tracer.replay.views.code import CodeView
from tracer.replay.views.compare import CompareView
from tracer.replay.views.kv_pages import KVPagesView
from tracer.replay.views.narration_bar import NarrationBar
from tracer.replay.views.queues import QueuesView
from tracer.replay.views.sequences import SequencesView
from tracer.replay.views.side_labels import side_labels
from tracer.replay.views.state_machine import StateMachineView
from tracer.replay.views.timeline import TimelineView
from tracer.replay.violations import ViolationsScreen
from tracer.trace.diff import DiffError
from tracer.trace.trace_file import TraceError, load_trace

MIN_WIDTH, MIN_HEIGHT = 40, 15  # below this the panels garble: say so instead
ROOMY_ROWS = 44  # from this height the code panel (c) shows below the state machine, not in its place
SIDE_BY_SIDE_COLUMNS = 180  # from this width --compare shows B's KV pages beside A's
SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # steps per second
POLL_S = 0.1  # how often a growing source is read (a few stat calls a second when nothing changed)
FOLLOW_ACTIONS = frozenset({"follow"})  # keys a growing source adds
LIVE_ACTIONS = frozenset({"toggle_engine", "add_request", "abort_selected"})  # keys live controls add
REPLACED_BY_LIVE = frozenset({"toggle_play", "toggle_animations", "hide_banner"})  # their keys: space, a, x
STEP_KEYS = Binding.Group(N_("step"), compact=True)  # the footer's "←→ step"
EVENT_KEYS = Binding.Group(N_("event"), compact=True)
SPEED_KEYS = Binding.Group(N_("speed"), compact=True)


def violation_text(violation) -> str:
    if isinstance(violation, dict):
        seq, invariant, message = (
            violation.get("seq_id"),
            violation.get("invariant", "invariant"),
            violation.get("message", ""),
        )
        if seq is not None:
            return _("{invariant} seq {seq}: {message}").format(invariant=invariant, seq=seq_tag(seq), message=message)
        return _("{invariant}: {message}").format(invariant=invariant, message=message)
    return str(violation)


def translate_bindings(node: App) -> None:
    """The footer's words in the reader's language: BINDINGS are class constants, made at import
    (N_-marked), so each node's copy of them is translated once the language is chosen."""
    table = node._bindings.key_to_bindings  # the node's own copy of its class's BINDINGS
    for key, bindings in table.items():
        table[key] = [
            replace(
                b,
                description=_(b.description) if b.description else "",
                group=replace(b.group, description=_(b.group.description)) if b.group else None,
            )
            for b in bindings
        ]


class GotoScreen(ModalScreen[int | None]):
    """`g`: type a step number."""

    BINDINGS = [Binding("escape", "cancel", N_("cancel"))]

    def __init__(self, first: int, last: int) -> None:
        super().__init__()
        self.first, self.last = first, last

    def compose(self) -> ComposeResult:
        with Vertical(id="goto-box"):
            yield Label(
                _("Go to step ({first}–{last}), Enter to jump, Esc to cancel").format(first=self.first, last=self.last)
            )
            yield Input(placeholder=_("step number"), type="integer", id="goto-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            self.dismiss(int(event.value))
        except ValueError:
            self.notify(_("type a whole step number"), severity="error")

    def action_cancel(self) -> None:
        self.dismiss(None)


class ReplayApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "nanoengine replay"
    ENABLE_COMMAND_PALETTE = False
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall"), (ROOMY_ROWS, "-roomy")]
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (SIDE_BY_SIDE_COLUMNS, "-wide")]

    # A key with two bindings runs the first one check_action allows: a growing source's End follows,
    # live controls' space / a / x drive the engine; without them those bindings are hidden.
    # The footer lists them in this order and cuts what does not fit: at 80 columns the live keys,
    # ? and q come before +/- and g (which the help lists).
    BINDINGS = [
        Binding("left", "step(-1)", N_("step"), key_display="←", priority=True, group=STEP_KEYS),
        Binding("right", "step(1)", N_("step"), key_display="→", priority=True, group=STEP_KEYS),
        Binding("home", "jump_end(0)", N_("first"), show=False, priority=True),
        Binding("end", "follow", N_("follow"), key_display="End", priority=True),
        Binding("end", "jump_end(1)", N_("last"), show=False, priority=True),
        Binding("space", "toggle_engine", N_("pause/run"), priority=True),
        Binding("space", "toggle_play", N_("play"), priority=True),
        Binding("a", "add_request", N_("add")),
        Binding("a", "toggle_animations", N_("animations"), show=False),
        Binding("x", "abort_selected", N_("abort")),
        Binding("x", "hide_banner", N_("hide banner"), show=False),
        Binding("n", "event(1)", N_("event"), group=EVENT_KEYS),
        Binding("p", "event(-1)", N_("event"), group=EVENT_KEYS),
        Binding("c", "toggle_code", N_("code")),
        Binding("question_mark", "help", N_("help"), key_display="?"),
        Binding("q", "quit", N_("quit")),
        Binding("plus,equals_sign", "speed(1)", N_("faster"), key_display="+", group=SPEED_KEYS),
        Binding("minus", "speed(-1)", N_("slower"), key_display="-", group=SPEED_KEYS),
        Binding("g", "goto", N_("go to")),
        Binding("v", "violations", N_("violations"), show=False),  # the violation bar says so
        Binding("z", "zoom", N_("zoom"), show=False),
        Binding("m", "more_narration", N_("more"), show=False),  # a cut narration ends "… m: more"
        Binding("escape", "deselect", N_("deselect"), show=False),
        Binding("s", "screenshot", N_("svg"), show=False),  # in the help
    ]
    # the main view's keys do nothing while a dialog (help, go to, predict) is open; q still quits
    MAIN_VIEW_ACTIONS = frozenset(b.action.partition("(")[0] for b in Binding.make_bindings(BINDINGS)) - {"quit"}

    playing = var(False, init=False)  # the play timer runs while True
    speed_index = var(1, init=False)  # into SPEEDS

    def __init__(
        self,
        trace,
        start_step: int = 0,
        predict: bool = False,
        *,
        animations: bool = True,
        screenshot_dir: str | Path = ".",
        guide: str = "",
        compare=None,
        live: EngineControls | None = None,
    ) -> None:
        """trace: a Trace, or a GrowingTrace (followed: read on a timer). compare: a second run of the
        same workload, shown step for step beside this one. live: a running engine's controls."""
        super().__init__()
        translate_bindings(self)
        self.model = ReplayModel(trace, start_step, compare)
        self.compare_header = viewer_header(compare) if compare is not None else {}  # B's, for its KV pages
        self.guide = guide or trace.header.get("look_for") or ""  # a lesson's or demo's "Look for" text
        self.quiz = Quiz() if predict else None
        self.live = live
        if live is not None:
            self.title = "nanoengine live"
        elif self.model.grows:
            self.title = "nanoengine replay --follow"
        self.animations = animations
        self.screenshot_dir = Path(screenshot_dir)
        self.play_timer: Timer | None = None
        self.poll_timer: Timer | None = None
        self.last_screenshot: Path | None = None
        self.failure: str | None = None  # why the app stopped, when a step could not be shown

    # ---- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="topbar")
        yield TimelineView(self.model.marks, self.model.step_numbers, id="timeline")
        yield NarrationBar(id="narration")
        warnings = tuple(w for w in [getattr(self.model.source, "warning", None)] if w)
        yield Banner(self.guide, warnings, predict=self.quiz is not None, id="banner")
        yield Static(id="violations")
        if self.model.compare is not None:
            yield CompareView(id="compare")
        yield QueuesView(id="queues")
        with Horizontal(id="upper"):
            with Vertical(id="left"):
                yield StateMachineView(id="machine")
                yield CodeView(id="code")
            yield KVPagesView(id="kv")
            if self.model.compare is not None:
                yield KVPagesView(id="kv-b")  # B's pool beside A's, from SIDE_BY_SIDE_COLUMNS on
        yield SequencesView(id="seqs")
        yield BatchView(id="batch")
        yield Footer(compact=True)
        yield Static(id="too-small")

    def on_mount(self) -> None:
        titles = {
            "machine": _("state machine · prefill/decode: nano-vllm's phases (?)"),
            "code": _("code that decided (c hides)"),
            "kv": _("KV pages"),
            "seqs": _("sequences"),
            "batch": _("batch (flat step inputs)"),
        }
        if self.model.compare is not None:
            label_a, label_b, _differences = side_labels(self.model.source, self.model.compare)
            titles.update(
                kv=_("KV pages · A = {label}").format(label=label_a),
                **{"kv-b": _("KV pages · B = {label}").format(label=label_b)},
            )
        for widget_id, title in titles.items():
            self.query_one(f"#{widget_id}").border_title = title
        self.machine.animations = self.animations
        self.kv.animations = self.animations
        self.machine.focus()
        self.show_step()
        self.update_topbar()
        if self.model.grows:
            self.poll_timer = self.set_interval(POLL_S, self.poll)

    def on_resize(self, event) -> None:
        small = event.size.width < MIN_WIDTH or event.size.height < MIN_HEIGHT
        self.screen.set_class(small, "-too-small")
        if small:
            self.query_one("#too-small", Static).update(
                _(
                    "Make the terminal larger: the replay needs at least {min_width}×{min_height} (this one "
                    "is {width}×{height})."
                ).format(min_width=MIN_WIDTH, min_height=MIN_HEIGHT, width=event.size.width, height=event.size.height)
            )

    @property
    def machine(self) -> StateMachineView:
        return self.query_one(StateMachineView)

    @property
    def code(self) -> CodeView:
        return self.query_one(CodeView)

    @property
    def kv(self) -> KVPagesView:
        return self.query_one("#kv", KVPagesView)

    @property
    def seqs(self) -> SequencesView:
        return self.query_one(SequencesView)

    @property
    def batch(self) -> BatchView:
        return self.query_one(BatchView)

    # ---- the model's state, as the views and tests read it ----------------------------------
    @property
    def steps(self):
        return self.model.steps

    @property
    def step_numbers(self) -> list[int]:
        return self.model.step_numbers

    @property
    def header(self) -> dict:
        return self.model.header

    @property
    def step_index(self) -> int:
        return self.model.index

    @property
    def current_step(self) -> dict:
        return self.model.current

    @property
    def step_number(self) -> int:
        return self.model.step_number

    @property
    def selected_seq(self) -> int | None:
        return self.model.selection.seq

    @property
    def selected_block(self) -> int | None:
        return self.model.selection.block

    # ---- reactive state -------------------------------------------------------------------
    def watch_playing(self, playing: bool) -> None:
        if playing:
            self.restart_timer()
        else:
            self.stop_timer()
        self.update_status()

    def watch_speed_index(self) -> None:
        if self.playing:
            self.restart_timer()
        self.update_status()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Keys of the main view do nothing while a dialog (help, go to, predict) is open; a growing
        source's and live controls' keys exist only with them (and take over End, space, a, x)."""
        if action in self.MAIN_VIEW_ACTIONS and isinstance(self.screen, ModalScreen):
            return False
        if action in FOLLOW_ACTIONS:
            return self.model.grows
        if action in LIVE_ACTIONS:
            return self.live is not None
        if action in REPLACED_BY_LIVE:
            return self.live is None
        return True

    # ---- redrawing ------------------------------------------------------------------------
    def show_step(self) -> None:
        if not self.steps:  # a growing source before its first step
            self.query_one(NarrationBar).say(self.waiting_text())
            self.update_status()
            return
        try:
            self.draw_step()
        except Exception as e:  # a value the schema allows but a view cannot show: stop with one line
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            self.failure = _("{path}: step {step} (line {line}) cannot be shown ({error})").format(
                path=self.model.source.path, step=self.step_number, line=self.step_index + 2, error=error
            )
            self.exit(return_code=2)

    def draw_step(self) -> None:
        """Redraw every view from the current step (and the previous one, for highlights)."""
        step, prev = self.model.current, self.model.previous
        for view in (self.machine, self.kv, self.seqs, self.batch, self.query_one(QueuesView), self.code):
            view.show(step, prev, self.header)
        self.query_one(NarrationBar).say(narrate(step, self.header, self.model.beam_scores()))
        self.show_violations(step)
        if self.model.diff is not None:
            mine, theirs = self.model.compare_sides()
            self.query_one(CompareView).show_pair(self.model.diff, mine, theirs, self.step_index, self.step_number)
            self.show_b_pool()
        self.update_status()

    def show_b_pool(self) -> None:
        """B's KV pages at this step (past the end of B: its last step stays)."""
        steps, i = self.model.compare.steps, self.step_index  # type: ignore[union-attr]  # only with --compare
        if i < len(steps):
            self.query_one("#kv-b", KVPagesView).show(steps[i], steps[i - 1] if i else None, self.compare_header)

    def show_violations(self, step: dict) -> None:
        bar = self.query_one("#violations", Static)
        violations = step.get("violations") or []
        bar.display = bool(violations)
        if violations:
            n = len(violations)
            count = ngettext(
                "✗ {count} invariant violation (v: all, with rules and code)",
                "✗ {count} invariant violations (v: all, with rules and code)",
                n,
            )
            text = Text(count.format(count=n), VIOLATION)
            text.append(" " + violation_text((ordered_violations(step) or violations)[0]))  # the clearest first
            bar.update(text)

    def update_status(self) -> None:
        """The timeline: the current step and the playback (or following) state."""
        self.query_one(TimelineView).show_position(self.step_index, self.status_text())

    def status_text(self) -> str:
        if not self.model.grows:
            speed = SPEEDS[self.speed_index]
            many = 1 if speed == 1 else 2
            if self.playing:
                state = ngettext("▶ playing {speed} step/s", "▶ playing {speed} steps/s", many)
            else:
                state = ngettext("■ paused {speed} step/s", "■ paused {speed} steps/s", many)
            return state.format(speed=f"{speed:g}")
        if self.model.broken:
            text = _("✗ stopped following (the file is damaged or was rewritten)")
        elif self.model.following:
            text = _("● following the newest step")
        else:
            text = _("◼ browsing history (End: follow the newest step)")
        return text if self.live is None else f"{text} · {self.live.status()}"

    def update_topbar(self) -> None:
        """The trace's title and config, the selection and the predict score: none of them change with the step."""
        header = self.header
        title = header.get("title") or Path(str(getattr(self.model.source, "path", "trace"))).name
        config = header.get("config", {})
        bar = Text(no_wrap=True, overflow="ellipsis")
        bar.append_text(self.badge())
        if self.quiz is not None:
            bar.append(" " + _("predict score {score}").format(score=self.quiz.score) + " ", "bold black on #ffd23f")
        bar.append(f" {title} ", "bold")
        budget = _("budget {budget} tokens").format(budget=config.get("max_num_batched_tokens", "?"))
        cache = f" · kv_cache_dtype {config['kv_cache_dtype']}" if "kv_cache_dtype" in config else ""
        bar.append(
            f"· {header.get('model', '?')} · block_size {config.get('block_size', '?')} · {budget}{cache}",
            "#a0a0a0",
        )
        if self.selected_seq is not None:
            bar.append(" · " + _("selected {seq}").format(seq=seq_tag(self.selected_seq)), "bold")
        self.query_one("#topbar", Static).update(bar)

    def badge(self) -> Text:
        """The top bar's first mark: what is shown (a followed trace or a live engine says so here)."""
        if self.live is not None:
            return self.live.badge()
        if self.model.grows:
            return Text(" ● " + _("FOLLOW") + " ", "bold black on #ffd23f")
        return Text(" nanoengine replay ", "bold black on #2ec4b6")

    def waiting_text(self) -> str:
        if self.live is not None:
            return self.live.WAITING
        return _("Waiting for the first step of {name} ...").format(name=self.model.source.path.name)

    def go_to(self, index: int) -> None:
        try:  # a damaged line of a lazy trace, or odd values in any trace, fail here
            moved = self.model.go_to(index)
        except TraceError as e:
            self.playing = False
            self.notify(str(e), title=_("cannot show this step"), severity="error", timeout=12, markup=False)
            return
        if moved:
            self.show_step()

    # ---- a growing source -----------------------------------------------------------------
    def poll(self) -> None:
        """Take the steps appended since the last poll; show the newest if following. The live
        controls' notices and engine state come with it. Nothing once the app is closing: its
        widgets are gone, and a timer tick can still land then (on a busy machine it does)."""
        if not self.query(TimelineView):
            return
        if self.model.grows and not self.model.broken:
            try:
                if self.model.poll():
                    self.take_steps()
            except TraceError:
                self.say_broken()
        if self.live is not None:
            self.live.after_poll(self)

    def take_steps(self) -> None:
        self.query_one(TimelineView).grow()
        if not self.model.following:
            self.update_status()
            return
        try:
            self.model.show_newest()
        except TraceError:
            self.say_broken()
            return
        self.show_step()

    def say_broken(self) -> None:
        self.notify(self.model.broken, title=_("stopped following"), severity="error", timeout=30, markup=False)
        self.update_status()

    def action_follow(self) -> None:
        self.playing = False
        if self.steps:
            self.go_to(self.model.last)
        self.model.following = True
        self.update_status()

    # ---- actions --------------------------------------------------------------------------
    def action_step(self, delta: int) -> None:
        if delta > 0 and self.model.at_newest and self.live is not None and self.live.step_engine():
            self.model.following = True  # the step it runs is shown when it arrives
        elif delta > 0:
            self.advance()
        else:
            self.go_to(self.step_index + delta)

    def action_jump_end(self, last: int) -> None:
        self.go_to(self.model.last if last else 0)

    def action_toggle_play(self) -> None:
        if not self.steps:
            return
        if not self.playing and self.model.at_newest:
            self.go_to(0)
        self.playing = not self.playing

    def stop_timer(self) -> None:
        if self.play_timer is not None:
            self.play_timer.stop()
            self.play_timer = None

    def restart_timer(self) -> None:
        self.stop_timer()
        self.play_timer = self.set_interval(1 / SPEEDS[self.speed_index], self.tick)

    def tick(self) -> None:
        if self.model.at_newest:
            self.playing = False
            return
        if self.quiz is not None:
            self.playing = False  # its question waits for an answer
        self.advance()

    def action_speed(self, delta: int) -> None:
        self.speed_index = max(0, min(len(SPEEDS) - 1, self.speed_index + delta))

    def action_goto(self) -> None:
        if self.steps:
            self.push_screen(GotoScreen(self.step_numbers[0], self.step_numbers[-1]), self.jump_to_number)

    def jump_to_number(self, number: int | None) -> None:
        if number is None:
            return
        index, note = self.model.index_of_number(number)
        if note:
            self.notify(note, severity="warning" if number > self.step_numbers[-1] else "information")
        self.go_to(index)

    def action_event(self, direction: int) -> None:
        target = self.model.event_from(direction)
        if target is None:
            self.notify(_("no later event") if direction > 0 else _("no earlier event"))
        else:
            self.go_to(target)

    def action_toggle_code(self) -> None:
        """The code panel takes the state machine's spare rows (its place, below 44 rows)."""
        self.screen.toggle_class("-code")
        if self.screen.has_class("-code"):
            self.code.redraw()

    def action_violations(self) -> None:
        violations = ordered_violations(self.current_step)
        if not violations:
            self.notify(_("no invariant violation at this step"))
            return
        sources = self.header.get("sources") or {}
        self.push_screen(ViolationsScreen(self.step_number, violations, sources), self.show_violation_code)

    def show_violation_code(self, index: int | None) -> None:
        violations = ordered_violations(self.current_step)
        if index is None or not 0 <= index < len(violations):
            return
        self.screen.add_class("-code")
        self.code.select_violation(violations[index])

    def action_zoom(self) -> None:
        if self.screen.maximized is not None:
            self.screen.minimize()
        elif self.focused is not None:
            self.screen.maximize(self.focused)

    def action_more_narration(self) -> None:
        self.query_one(NarrationBar).toggle()

    def action_hide_banner(self) -> None:
        self.query_one(Banner).hide()

    def action_deselect(self) -> None:
        self.select(None)

    def action_toggle_animations(self) -> None:
        self.animations = not self.animations
        self.machine.animations = self.kv.animations = self.animations
        self.notify(_("animations on") if self.animations else _("animations off"))

    def action_screenshot(self) -> None:  # type: ignore[override]  # no filename/path: always the trace's folder
        if not self.steps:
            return
        self.screenshot_dir.mkdir(parents=True, exist_ok=True)
        path = self.screenshot_dir / f"nanoengine-step-{self.step_number}.svg"
        path.write_text(fit_wide_text(self.export_screenshot()), encoding="utf-8")
        self.last_screenshot = path
        self.notify(_("screenshot saved: {path}").format(path=path), markup=False)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.live.HELP if self.live is not None else None))

    async def action_quit(self) -> None:
        self.exit(0)

    # ---- live controls' keys (check_action offers them only with live controls) -------------
    def action_toggle_engine(self) -> None:
        if self.live is not None:
            self.live.toggle_engine(self)

    def action_add_request(self) -> None:
        if self.live is not None:
            self.live.ask_for_request(self)

    def action_abort_selected(self) -> None:
        if self.live is not None:
            self.live.abort_selected(self)

    # ---- predict mode ---------------------------------------------------------------------
    def advance(self) -> None:
        """→ and play: the next step; in predict mode a question about it comes first."""
        if self.quiz is None or self.model.at_newest:
            self.go_to(self.step_index + 1)
            return
        if self.quiz.asking:
            return
        question = self.quiz.ask(self.current_step, self.steps[self.step_index + 1], self.header)
        if question is None:
            self.go_to(self.step_index + 1)
            return
        self.clear_notifications()  # the previous answer's toast would cover this question
        self.push_screen(PredictScreen(self.quiz, question), self.reveal)

    def reveal(self, right: bool | None) -> None:
        """The answer's verdict (None: skipped), then the step it was about."""
        if self.quiz is not None and right is not None:
            self.notify(
                self.quiz.last_reveal, severity="information" if right else "warning", timeout=8 if right else 10
            )
        self.go_to(self.step_index + 1)
        self.query_one(Banner).show_guide()
        self.update_topbar()

    # ---- selection ------------------------------------------------------------------------
    def select(self, seq_id: int | None, block: int | None = None) -> None:
        self.model.select(seq_id, block)
        self.machine.select(seq_id)
        self.kv.select(seq_id, block)
        self.seqs.select(seq_id)
        self.batch.select(seq_id)
        self.code.select(seq_id)
        self.update_topbar()

    @on(SeqSelected)
    def seq_selected(self, event: SeqSelected) -> None:
        self.select(event.seq_id)

    @on(KVPagesView.BlockClicked)
    def block_clicked(self, event: KVPagesView.BlockClicked) -> None:
        self.select(self.model.owner_to_select(event.owners), event.block)

    @on(TimelineView.Seek)
    def seek(self, event: TimelineView.Seek) -> None:
        self.go_to(event.index)


def parse_terminal_size(text: str) -> tuple[int, int]:
    """'160x48' -> (160, 48), for --size flags; the TUI needs at least MIN_WIDTH x MIN_HEIGHT."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(_("--size takes WIDTHxHEIGHT, e.g. 160x48; got {text!r}").format(text=text)) from None
    if w < MIN_WIDTH or h < MIN_HEIGHT:
        raise ValueError(
            _("--size {text} is too small for the TUI: use at least {width}x{height}").format(
                text=text, width=MIN_WIDTH, height=MIN_HEIGHT
            )
        )
    return w, h


def run_replay(
    path: str | Path, start_step: int = 0, predict: bool = False, guide: str = "", compare: str | Path | None = None
) -> int:
    """Open a trace file in the TUI. start_step is a step index (0 = the first recorded step).
    compare: a second trace of the same workload, shown step for step beside it."""
    try:
        trace = load_trace(path)
        other = load_trace(compare) if compare is not None else None
    except TraceError as e:
        say_error(str(e))
        return 2
    if not trace.steps:
        say_error(_("{path} has a header but no steps: nothing to replay").format(path=path))
        return 2
    if not 0 <= start_step < len(trace.steps):
        say_error(
            _("step {step} is outside the trace: choose 0 .. {last}").format(step=start_step, last=len(trace.steps) - 1)
        )
        return 2
    if start_step == 0:
        start_step = focus_index(trace) or 0
    if predict:
        start_step = predict_start(start_step)
    try:
        app = ReplayApp(trace, start_step, predict, guide=guide, compare=other)
    except DiffError as e:
        say_error(f"--compare: {e}")
        return 2
    try:
        app.model.check(app.step_index)
        app.model.check(max(0, app.step_index - 1))
    except TraceError as e:
        say_error(str(e))
        return 2
    if not (sys.stdin.isatty() and sys.stdout.isatty()) and "TEXTUAL_DRIVER" not in os.environ:  # --web sets it
        say_error(
            _(
                "the replay needs an interactive terminal (input or output is redirected); "
                "run `nanoengine replay {path}` in a terminal, or `nanoengine check {path}`"
            ).format(path=path)
        )
        return 2
    result = app.run()
    if app.failure:
        say_error(app.failure[:400])
    return app.return_code or result or 0


def say_error(message: str) -> None:
    """'nanoengine: error: ...' on stderr, worded as every command words it (tracer.cli.main)."""
    from tracer.i18n import error_line

    print(error_line(message), file=sys.stderr)
