"""Predict mode: before the next step is revealed, ask the student one question about it.

Questions are built from (the step on screen, the next step, header) and are answerable from what
is on screen plus the engine's rules: a sequence's next status, slot_mapping[0], the block a
sequence gets next, or how many tokens a sequence is scheduled.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, Static

from nanoengine.sequence import EventKind
from tracer.replay.colors import seq_tag
from tracer.replay.narration import narrate

STATUSES = ("WAITING", "RUNNING", "FINISHED")
MAX_BLOCK_CHOICES = 4


@dataclass(frozen=True, slots=True)
class Question:
    prompt: str
    answer: str
    choices: tuple[str, ...] = ()  # empty: a typed answer
    explanation: str = ""


def make_question(shown: dict, upcoming: dict, header: dict) -> Question | None:
    """One question about `upcoming`, rotating the kind by step number; None if nothing to ask."""
    makers = (status_question, slot_question, block_question, scheduled_question)
    candidates = [q for q in (maker(shown, upcoming, header) for maker in makers) if q is not None]
    if not candidates:
        return None
    return candidates[upcoming.get("step", 0) % len(candidates)]


def is_correct(question: Question, answer: str) -> bool:
    return answer.strip().lower() == question.answer.strip().lower()


def status_question(shown: dict, upcoming: dict, header: dict) -> Question | None:
    live = [s for s in upcoming.get("seqs", []) if s.get("status_before") != "FINISHED"]
    if not live:
        return None
    changed = [s for s in live if s.get("status_before") != s.get("status_after")]
    seq = (changed or live)[upcoming.get("step", 0) % len(changed or live)]
    return Question(
        f"Which status will seq {seq_tag(seq['seq_id'])} have after step {upcoming.get('step')}?",
        seq["status_after"],
        STATUSES,
        narrate(upcoming, header),
    )


def slot_question(shown: dict, upcoming: dict, header: dict) -> Question | None:
    inputs = upcoming.get("inputs", {})
    if not inputs.get("slot_mapping"):
        return None
    block_size = upcoming["pool"]["block_size"]
    position, tables = inputs["positions"][0], inputs.get("block_tables") or [[]]
    if position // block_size >= len(tables[0]):
        return None  # a damaged trace: the explanation could not be given
    block = tables[0][position // block_size]
    return Question(
        f"Step {upcoming.get('step')} runs seq {seq_tag(inputs['seq_ids'][0])} first. What is slot_mapping[0]?",
        str(inputs["slot_mapping"][0]),
        (),
        f"position {position} → block_table[{position} // {block_size}] = block {block}; "
        f"slot = {block} × {block_size} + {position % block_size} = {inputs['slot_mapping'][0]}",
    )


def block_question(shown: dict, upcoming: dict, header: dict) -> Question | None:
    hits = {e["seq_id"] for e in upcoming.get("events", []) if e["kind"] == EventKind.PREFIX_HIT}
    free = list(shown.get("pool", {}).get("free_block_ids", [])) if shown else []
    for seq in upcoming.get("seqs", []):
        if seq["seq_id"] in hits:  # blocks from the prefix cache are not 'the next free block'
            continue
        before, after = seq.get("block_table", []), seq.get("block_table_after", [])
        old = previous_table(shown, seq["seq_id"])
        new = [b for b in before if b not in old]
        if not new or after[: len(before)] != before:
            continue
        choices = sorted(set(free[:MAX_BLOCK_CHOICES]) | {new[0]})
        if len(choices) < 2:
            continue
        return Question(
            f"Seq {seq_tag(seq['seq_id'])} needs a new KV block in step {upcoming.get('step')}. "
            f"Which physical block will it get?",
            str(new[0]),
            tuple(map(str, choices)),
            "New blocks come from the front of the free list (the block freed longest ago).",
        )
    return None


def previous_table(shown: dict | None, seq_id: int) -> list[int]:
    for seq in (shown or {}).get("seqs", []):
        if seq["seq_id"] == seq_id:
            return seq.get("block_table_after", [])
    return []


def scheduled_question(shown: dict, upcoming: dict, header: dict) -> Question | None:
    scheduled = [s for s in upcoming.get("seqs", []) if s.get("num_scheduled_tokens", 0) > 0]
    if not scheduled:
        return None
    seq = max(scheduled, key=lambda s: (s["num_scheduled_tokens"], -s["seq_id"]))
    budget = header.get("config", {}).get("max_num_batched_tokens")
    return Question(
        f"How many tokens will seq {seq_tag(seq['seq_id'])} compute in step {upcoming.get('step')} "
        f"(num_scheduled_tokens)? The token budget is {budget}.",
        str(seq["num_scheduled_tokens"]),
        (),
        narrate(upcoming, header),
    )


class PredictScreen(ModalScreen[str | None]):
    """Asks one Question; dismisses with the answer, or None when skipped (Esc)."""

    BINDINGS = [Binding("escape", "skip", "skip")]

    def __init__(self, question: Question, score: str, previous: str = "") -> None:
        super().__init__()
        self.question = question
        self.score = score
        self.previous = previous  # the last answer's verdict: shown here, not as a toast over the question

    def compose(self) -> ComposeResult:
        with Vertical(id="predict-box"):
            yield Label(f"Predict the next step  ·  score {self.score}", id="predict-title")
            if self.previous:
                yield Static(Text(self.previous), id="predict-previous")
            yield Static(self.question.prompt, id="predict-question")
            if self.question.choices:
                yield OptionList(*self.question.choices, id="predict-choices")
            else:
                yield Input(placeholder="your answer, then Enter", type="integer", id="predict-input")
            yield Static("Enter answers · Esc reveals without scoring", classes="predict-hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(str(event.option.prompt))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.dismiss(event.value)

    def action_skip(self) -> None:
        self.dismiss(None)
