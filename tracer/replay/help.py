"""The `?` screen: every key, how to read the views without colour, the terms (each identifier with
its word: in Chinese the one the seed articles use) and the names in vLLM v1 and nano-vllm."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tracer.i18n import N_, _
from tracer.replay.glossary import CONCEPTS, GLOSSARY

KEYS = (
    ("← / →", N_("previous / next step")),
    ("Home / End", N_("first / last step")),
    ("space", N_("play / pause")),
    ("+ / -", N_("play faster / slower")),
    ("g", N_("go to a step number")),
    ("n / p", N_("next / previous event (admit, prefix hit, prefill done, preempt, finish, violation)")),
    ("c", N_("code: the engine function behind the step's event, its deciding line ▶, and vLLM v1's counterpart")),
    ("v", N_("every invariant violation at the step: its rule, its cell (marked ✗), the function it checks")),
    ("Tab / shift+Tab", N_("move between panels")),
    (N_("↑ / ↓ in sequences"), N_("select a sequence (also: click a chip, a block or a batch column)")),
    ("Esc", N_("clear the selection")),
    ("x", N_("hide the banner (a lesson's or demo's Look for text, loader warnings)")),
    ("z", N_("zoom the focused panel to the full screen (again to restore)")),
    ("m", N_("the whole narration, when it is cut (its last row ends '… m: more'); again to cut it")),
    ("a", N_("animations on / off")),
    ("s", N_("save an SVG screenshot")),
    ("?", N_("this help")),
    ("q", N_("quit")),
)

LEGEND = (
    ("A B C …", N_("one letter per sequence (its seq_id is shown as A#0, B#1 …); same colour everywhere")),
    ("◷ ▶ ✓", N_("WAITING, RUNNING, FINISHED")),
    ("A▅×2", N_("KV block owned by A, fill level of its slots, ref count 2 (a shared prefix)")),
    ("A▅ 3", N_("selected sequence: the block is logical block 3 (block_table[3], counted from 0)")),
    ("○█", N_("free block that still holds cached (hashed) KV: reusable by a prefix hit")),
    ("·", N_("free block")),
    ("◆", N_("KV slots written in this block this step")),
    ("A▅×2◆", N_("a prefix hit on a block A computes in this same step (vLLM v1's rule): shared and written")),
    (N_("underline"), N_("changed since the previous step")),
    ("▲ / ✗", N_("logits kept / discarded (mid-prefill) in the batch's logits_indices row")),
    ("P H F !", N_("timeline: preemption, prefix-cache hit, finish, invariant violation")),
    (
        N_("queues"),
        N_("the running list and waiting queue as the step FOUND them (the rest of the screen is the step's end)"),
    ),
    ("+A#0", N_("queue line: admitted by this step (so it is still in the waiting queue at the step's start)")),
    ("✗A#0", N_("queue line: preempted by this step (it goes back to the head of the waiting queue)")),
    ("↩A#0", N_("queue line: preempted by the previous step, now back at the head of the waiting queue")),
    (
        "prefill / decode",
        N_(
            "lanes of RUNNING: nano-vllm's phases. vLLM v1 has none: each step catches num_computed_tokens "
            "up to num_tokens, as many tokens as the budget allows"
        ),
    ),
    ("tokens cached sched", N_("num_tokens, num_cached_tokens, num_scheduled_tokens (a→b: before→after the step)")),
    ("gen/max", N_("completion tokens so far / the request's max_tokens")),
    (N_("dim italic text"), N_("the chat template around your prompt (`--raw` sends the prompt without it)")),
    ("⟨?⟩", N_("bytes of a character still incomplete (Chinese, emoji): it becomes the character with its last byte")),
    (
        "D#3<A#0 ├0",
        N_(
            "a beam of request 0's beam search, forked from A#0; the bracket joins the search's beams ('┌0 k=3': beam_width 3)"
        ),
    ),
    ("✂", N_("a pruned beam: none of its candidates ranked among the beam_width best")),
    (
        "⧉ 1→2",
        N_(
            "KV pages: block 2 is a copy-on-write copy of block 1, made this step (a beam was to write into a shared block)"
        ),
    ),
)


def concepts_text() -> Text:
    """Each identifier, the word for it (in Chinese: the term the seed articles use) and its meaning."""
    text = Text()
    text.append(_("Terms") + "\n", "italic")
    for concept in CONCEPTS:
        text.append(concept.identifier, "bold #ffd23f")
        text.append("  " + _(concept.term) + "\n", "bold")
        text.append("  " + _(concept.meaning) + "\n")
    text.rstrip()
    return text


def glossary_text() -> Text:
    """Each term, then its vLLM v1 and nano-vllm names on their own lines: wrapped at spaces, so
    an upstream path is never split in the middle (a three-column table folds them on 80 columns)."""
    text = Text()
    text.append(_("Names in vLLM v1 and nano-vllm") + "\n", "italic")
    for term in GLOSSARY:
        text.append(_(term.ours) + "\n", "bold #ffd23f")
        text.append("  vLLM v1: ", "bold")
        text.append(_(term.vllm) + "\n")
        if term.note:
            text.append(f"  ({_(term.note)})\n", "dim")
        text.append("  nano-vllm: ", "bold")
        text.append(_(term.nano_vllm) + "\n")
    text.rstrip()
    return text


def help_table(title: str, rows: tuple[tuple[str, str], ...]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2, 0, 0))
    table.add_column(style="bold #ffd23f", no_wrap=True)
    table.add_column(overflow="fold")  # a Chinese phrase longer than the column folds between characters
    for key, meaning in rows:
        table.add_row(_(key), _(meaning))  # N_-marked rows; a mode's own rows come translated or not at all
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss_help", N_("close"))]

    def __init__(self, mode_keys: tuple[str, tuple[tuple[str, str], ...]] | None = None) -> None:
        """mode_keys: (title, rows) of keys a mode adds or changes (the live app's), shown first."""
        super().__init__()
        self.mode_keys = mode_keys

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            if self.mode_keys is not None:
                yield Static(help_table(*self.mode_keys))
                yield Static(Text(""))
            yield Static(help_table(_("Keys"), KEYS))
            yield Static(Text(""))
            yield Static(help_table(_("Reading the views"), LEGEND))
            yield Static(Text(""))
            yield Static(concepts_text(), id="concepts")
            yield Static(Text(""))
            yield Static(glossary_text(), id="glossary")
            yield Static(Text(_("Esc, q or ? closes this help."), style="dim"))

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
