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
    ("c", "code: the engine function behind the step's event, its deciding line ▶, and vLLM v1's counterpart"),
    ("v", "every invariant violation at the step: its rule, its cell (marked ✗), the function it checks"),
    ("Tab / shift+Tab", "move between panels"),
    ("↑ / ↓ in sequences", "select a sequence (also: click a chip, a block or a batch column)"),
    ("Esc", "clear the selection"),
    ("x", "hide the banner (a lesson's or demo's Look for text, loader warnings)"),
    ("z", "zoom the focused panel to the full screen (again to restore)"),
    ("m", "the whole narration, when it is cut (its last row ends '… m: more'); again to cut it"),
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
    ("A▅×2◆", "a prefix hit on a block A computes in this same step (vLLM v1's rule): shared and written"),
    ("underline", "changed since the previous step"),
    ("▲ / ✗", "logits kept / discarded (mid-prefill) in the batch's logits_indices row"),
    ("P H F !", "timeline: preemption, prefix-cache hit, finish, invariant violation"),
    (
        "queues",
        "the running list and waiting queue as the step FOUND them (the rest of the screen is the step's end)",
    ),
    ("+A#0", "queue line: admitted by this step (so it is still in the waiting queue at the step's start)"),
    ("✗A#0", "queue line: preempted by this step (it goes back to the head of the waiting queue)"),
    ("↩A#0", "queue line: preempted by the previous step, now back at the head of the waiting queue"),
    (
        "prefill / decode",
        "lanes of RUNNING: nano-vllm's phases. vLLM v1 has none: each step catches num_computed_tokens "
        "up to num_tokens, as many tokens as the budget allows",
    ),
    ("tokens cached sched", "num_tokens, num_cached_tokens, num_scheduled_tokens (a→b: before→after the step)"),
    ("gen/max", "completion tokens so far / the request's max_tokens"),
    ("dim italic text", "the chat template around your prompt (`--raw` sends the prompt without it)"),
    ("⟨?⟩", "bytes of a character still incomplete (Chinese, emoji): it becomes the character with its last byte"),
)


def glossary_text() -> Text:
    """Each term, then its vLLM v1 and nano-vllm names on their own lines: wrapped at spaces, so
    an upstream path is never split in the middle (a three-column table folds them on 80 columns)."""
    text = Text()
    text.append("Names in vLLM v1 and nano-vllm\n", "italic")
    for term in GLOSSARY:
        text.append(term.ours + "\n", "bold #ffd23f")
        text.append("  vLLM v1: ", "bold")
        text.append(term.vllm + "\n")
        if term.note:
            text.append(f"  ({term.note})\n", "dim")
        text.append("  nano-vllm: ", "bold")
        text.append(term.nano_vllm + "\n")
    text.rstrip()
    return text


def help_table(title: str, rows: tuple[tuple[str, str], ...]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2, 0, 0))
    table.add_column(style="bold #ffd23f", no_wrap=True)
    table.add_column()
    for key, meaning in rows:
        table.add_row(key, meaning)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss_help", "close")]

    def __init__(self, mode_keys: tuple[str, tuple[tuple[str, str], ...]] | None = None) -> None:
        """mode_keys: (title, rows) of keys a mode adds or changes (the live app's), shown first."""
        super().__init__()
        self.mode_keys = mode_keys

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            if self.mode_keys is not None:
                yield Static(help_table(*self.mode_keys))
                yield Static(Text(""))
            yield Static(help_table("Keys", KEYS))
            yield Static(Text(""))
            yield Static(help_table("Reading the views", LEGEND))
            yield Static(Text(""))
            yield Static(glossary_text(), id="glossary")
            yield Static(Text("Esc, q or ? closes this help.", style="dim"))

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
