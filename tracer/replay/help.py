"""The `?` screen: every key, and how to read the views without colour."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tracer.replay.glossary import GLOSSARY

KEYS = (
    ("← / →", "previous / next step"),
    ("Home / End", "first / last step"),
    ("space", "play / pause"),
    ("+ / -", "play faster / slower"),
    ("g", "go to a step number"),
    ("n / p", "next / previous event (admit, prefix hit, prefill done, preempt, finish, violation)"),
    ("Tab / shift+Tab", "move between panels"),
    ("↑ / ↓ in sequences", "select a sequence (also: click a chip, a block or a batch column)"),
    ("Esc", "clear the selection"),
    ("x", "hide the banner (a lesson's or demo's Look for text, loader warnings)"),
    ("z", "zoom the focused panel to the full screen (again to restore)"),
    ("a", "animations on / off"),
    ("s", "save an SVG screenshot"),
    ("?", "this help"),
    ("q", "quit"),
)

LEGEND = (
    ("A B C …", "one letter per sequence (its seq_id is shown as A#0, B#1 …); same colour everywhere"),
    ("◷ ▶ ✓", "WAITING, RUNNING, FINISHED"),
    ("A▅×2", "KV block owned by A, fill level of its slots, ref count 2 (a shared prefix)"),
    ("A▅ 3", "selected sequence: the block is logical block 3 (block_table[3], counted from 0)"),
    ("○█", "free block that still holds cached (hashed) KV: reusable by a prefix hit"),
    ("·", "free block"),
    ("◆", "KV slots written in this block this step"),
    ("underline", "changed since the previous step"),
    ("▲ / ✗", "logits kept / discarded (mid-prefill) in the batch's logits_indices row"),
    ("P H F !", "timeline: preemption, prefix-cache hit, finish, invariant violation"),
    ("tokens cached sched", "num_tokens, num_cached_tokens, num_scheduled_tokens (a→b: before→after the step)"),
)


def glossary_table() -> Table:
    table = Table(title="Names in vLLM v1 and nano-vllm", title_justify="left", box=None, padding=(0, 2, 0, 0))
    table.add_column("nanoengine", style="bold #ffd23f", overflow="fold")  # fold: paths stay whole
    table.add_column("vLLM v1", overflow="fold")
    table.add_column("nano-vllm", overflow="fold")
    for term in GLOSSARY:
        table.add_row(term.ours, term.vllm + (f"\n[dim]{term.note}[/]" if term.note else ""), term.nano_vllm)
    return table


def help_table(title: str, rows: tuple[tuple[str, str], ...]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2, 0, 0))
    table.add_column(style="bold #ffd23f", no_wrap=True)
    table.add_column()
    for key, meaning in rows:
        table.add_row(key, meaning)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss_help", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(help_table("Keys", KEYS))
            yield Static(Text(""))
            yield Static(help_table("Reading the views", LEGEND))
            yield Static(Text(""))
            yield Static(glossary_table())
            yield Static(Text("Esc, q or ? closes this help.", style="dim"))

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
