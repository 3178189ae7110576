"""Predict mode: before the next step is revealed, ask the student one question about it.

Questions are built from (the step on screen, the next step, header) and only ask what the screen
and the engine's rules determine: a sequence's next status (only when no end-of-sequence token or
stop string could change it: the sequences panel shows gen/max_tokens and whether EOS is ignored),
the KV slot of a scheduled token whose block is already in its table, the block a sequence gets
next (the free list's head), how many tokens a sequence or the whole step computes. The kind
changes from one question to the next.

    predict_start(focus) -> the step index to open at (the step before the one that matters)
    quiz = Quiz()                                      # the score, across questions
    quiz.ask(shown, upcoming, header) -> Question | None
    PredictScreen(quiz, question)                      # the app pushes it; dismisses with the verdict
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, Static

from nanoengine.sequence import EventKind
from tracer.i18n import N_, _
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
    kind: str = ""  # which maker asked it: the next question is of another kind


def predict_start(step_index: int) -> int:
    """Predict mode opens one step before the step that matters, so that step is the first to be
    predicted instead of already on screen."""
    return max(0, step_index - 1)


def make_question(shown: dict, upcoming: dict, header: dict, avoid: str = "") -> Question | None:
    """One question about `upcoming`: the kinds take turns (the first one that can be asked after
    the kind asked last, `avoid`); None if nothing determinable can be asked."""
    candidates = {q.kind: q for q in (maker(shown, upcoming, header) for maker in MAKERS) if q is not None}
    if not candidates:
        return None
    start = KINDS.index(avoid) + 1 if avoid in KINDS else upcoming.get("step", 0)
    turns = [KINDS[(start + i) % len(KINDS)] for i in range(len(KINDS))]
    return next(candidates[kind] for kind in turns if kind in candidates)


def is_correct(question: Question, answer: str) -> bool:
    return answer.strip().lower() == question.answer.strip().lower()


@dataclass(slots=True)
class Quiz:
    """Predict mode across its questions: the score, the last verdict (shown above the next
    question), the kind asked last (the next asks another), and whether a question is open."""

    right: int = 0
    asked: int = 0
    last_reveal: str = ""
    last_kind: str = ""
    asking: bool = False

    @property
    def score(self) -> str:
        return f"{self.right}/{self.asked}"

    def ask(self, shown: dict, upcoming: dict, header: dict) -> Question | None:
        """The question to ask before `upcoming` is shown; None if nothing determinable can be asked."""
        question = make_question(shown, upcoming, header, avoid=self.last_kind)
        if question is not None:
            self.asking, self.last_kind = True, question.kind
        return question

    def take(self, question: Question, answer: str | None) -> bool | None:
        """Score an answer (None: skipped, not scored); its verdict becomes last_reveal."""
        self.asking = False
        if answer is None:
            return None
        self.asked += 1
        if is_correct(question, answer):
            self.right += 1
            self.last_reveal = _("✓ right: {answer}. {explanation}").format(
                answer=question.answer, explanation=question.explanation
            )
            return True
        self.last_reveal = _("✗ it was {answer} (you said {yours}). {explanation}").format(
            answer=question.answer, yours=answer, explanation=question.explanation
        )
        return False


def params_of(header: dict, seq_id: int) -> dict:
    for request in header.get("requests", []):
        if request.get("seq_id") == seq_id:
            return request.get("params") or {}
    return {}


def outcome_is_determined(seq: dict, header: dict) -> bool:
    """Whether the screen tells this sequence's next status: a sampled token could be an EOS or
    complete a stop string unless EOS is ignored and there are no stop strings, or the token is
    its last by max_tokens anyway."""
    params = params_of(header, seq["seq_id"])
    if seq.get("finish_reason") in ("abort", "error", "ignored"):
        return False  # an abort comes from outside the engine; an error from a failing step
    if params.get("ignore_eos") and not params.get("stop"):
        return True
    generated = seq.get("num_tokens_after", 0) - seq.get("num_prompt_tokens", 0)
    last_by_length = bool(seq.get("new_token_ids")) and generated >= params.get("max_tokens", 1 << 30)
    samples = seq.get("num_scheduled_tokens", 0) > 0 and bool(seq.get("new_token_ids"))
    return last_by_length or not samples and seq.get("status_after") != "FINISHED"


def status_question(shown: dict, upcoming: dict, header: dict) -> Question | None:
    on_screen = {s["seq_id"] for s in (shown or {}).get("seqs", [])}  # a request arriving next is not
    live = [
        s
        for s in upcoming.get("seqs", [])
        if s["seq_id"] in on_screen and s.get("status_before") != "FINISHED" and outcome_is_determined(s, header)
    ]
    if not live:
        return None
    changed = [s for s in live if s.get("status_before") != s.get("status_after")]
    seq = (changed or live)[upcoming.get("step", 0) % len(changed or live)]
    params = params_of(header, seq["seq_id"])
    return Question(
        _(
            "Which status will seq {seq} have after step {step}? "
            "(max_tokens {max_tokens}; the gen column counts what it has generated)"
        ).format(seq=seq_tag(seq["seq_id"]), step=upcoming.get("step"), max_tokens=params.get("max_tokens", "?")),
        seq["status_after"],
        STATUSES,
        narrate(upcoming, header),
        "status",
    )


def table_before(shown: dict | None, seq_id: int) -> list[int]:
    for seq in (shown or {}).get("seqs", []):
        if seq["seq_id"] == seq_id:
            return seq.get("block_table_after", [])
    return []


def slot_question(shown: dict, upcoming: dict, header: dict) -> Question | None:
    """The slot of one sequence's first scheduled token, rotating over the batch, asked only when
    that token's block is already in the table on screen (a new block would be another question)."""
    inputs = upcoming.get("inputs", {})
    seq_ids, starts = inputs.get("seq_ids") or [], inputs.get("query_start_loc") or []
    if not inputs.get("slot_mapping") or len(starts) < len(seq_ids) + 1 or not seq_ids:
        return None
    block_size = upcoming["pool"]["block_size"]
    for turn in range(len(seq_ids)):
        row = (upcoming.get("step", 0) + turn) % len(seq_ids)
        token = starts[row]
        position, seq_id = inputs["positions"][token], seq_ids[row]
        table = table_before(shown, seq_id)
        if position // block_size >= len(table):
            continue
        block, slot = table[position // block_size], inputs["slot_mapping"][token]
        return Question(
            _(
                "Step {step} computes seq {seq}'s token at position {position} "
                "(its first this step). Which KV slot is it written to (slot_mapping)?"
            ).format(step=upcoming.get("step"), seq=seq_tag(seq_id), position=position),
            str(slot),
            (),
            _(
                "position {position} → block_table[{position} // {block_size}] = block {block}; "
                "slot = {block} × {block_size} + {offset} = {slot}"
            ).format(position=position, block_size=block_size, block=block, offset=position % block_size, slot=slot),
            "slot",
        )
    return None


def block_question(shown: dict, upcoming: dict, header: dict) -> Question | None:
    hits = {e["seq_id"] for e in upcoming.get("events", []) if e["kind"] == EventKind.PREFIX_HIT}
    free = list(shown.get("pool", {}).get("free_block_ids", [])) if shown else []
    for seq in upcoming.get("seqs", []):
        if seq["seq_id"] in hits:  # blocks from the prefix cache are not 'the next free block'
            continue
        before, after = seq.get("block_table", []), seq.get("block_table_after", [])
        old = table_before(shown, seq["seq_id"])
        new = [b for b in before if b not in old]
        if not new or after[: len(before)] != before:
            continue
        choices = sorted(set(free[:MAX_BLOCK_CHOICES]) | {new[0]})
        if len(choices) < 2:
            continue
        return Question(
            _("Seq {seq} needs a new KV block in step {step}. Which physical block will it get?").format(
                seq=seq_tag(seq["seq_id"]), step=upcoming.get("step")
            ),
            str(new[0]),
            tuple(map(str, choices)),
            _("New blocks come from the front of the free list (the block freed longest ago)."),
            "block",
        )
    return None


def scheduled_question(shown: dict, upcoming: dict, header: dict) -> Question | None:
    scheduled = [s for s in upcoming.get("seqs", []) if s.get("num_scheduled_tokens", 0) > 0]
    if not scheduled:
        return None
    seq = max(scheduled, key=lambda s: (s["num_scheduled_tokens"], -s["seq_id"]))
    budget = header.get("config", {}).get("max_num_batched_tokens")
    return Question(
        _(
            "How many tokens will seq {seq} compute in step {step} (num_scheduled_tokens)? The token budget "
            "is {budget}."
        ).format(seq=seq_tag(seq["seq_id"]), step=upcoming.get("step"), budget=budget),
        str(seq["num_scheduled_tokens"]),
        (),
        narrate(upcoming, header),
        "scheduled",
    )


def batch_question(shown: dict, upcoming: dict, header: dict) -> Question | None:
    """The step's whole batch: what the running sequences still need and the waiting head, under the budget."""
    total = len(upcoming.get("inputs", {}).get("input_ids") or [])
    if not total:
        return None
    budget = header.get("config", {}).get("max_num_batched_tokens")
    return Question(
        _("How many tokens will step {step} compute in all (the batch's length)? The token budget is {budget}.").format(
            step=upcoming.get("step"), budget=budget
        ),
        str(total),
        (),
        _(
            "running sequences first, each what it still needs, then admissions, until the budget of {budget} "
            "is spent: {total}."
        ).format(budget=budget, total=total)
        + " "
        + narrate(upcoming, header),
        "batch",
    )


MAKERS: tuple[Callable[[dict, dict, dict], Question | None], ...] = (
    status_question,
    slot_question,
    block_question,
    scheduled_question,
    batch_question,
)


class PredictScreen(ModalScreen[bool | None]):
    """Predict mode's dialog: asks one Question over the step still shown, scores the answer in
    the Quiz and dismisses with the verdict (True right, False wrong, None skipped with Esc)."""

    BINDINGS = [Binding("escape", "skip", N_("skip"))]

    def __init__(self, quiz: Quiz, question: Question) -> None:
        super().__init__()
        self.quiz = quiz
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="predict-box"):
            yield Label(_("Predict the next step  ·  score {score}").format(score=self.quiz.score), id="predict-title")
            if self.quiz.last_reveal:  # the last answer's verdict: shown here, not as a toast over the question
                yield Static(Text(self.quiz.last_reveal), id="predict-previous")
            yield Static(self.question.prompt, id="predict-question")
            if self.question.choices:
                yield OptionList(*self.question.choices, id="predict-choices")
            else:
                yield Input(placeholder=_("your answer, then Enter"), type="integer", id="predict-input")
            yield Static(_("Enter answers · Esc reveals without scoring"), classes="predict-hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.answer(str(event.option.prompt))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.answer(event.value)

    def answer(self, answer: str) -> None:
        self.dismiss(self.quiz.take(self.question, answer))

    def action_skip(self) -> None:
        self.dismiss(self.quiz.take(self.question, None))


KINDS = ("status", "slot", "block", "scheduled", "batch")  # MAKERS' kinds, in turn order
