"""What to look for at the step that matters, in words true for the run on screen.

A scenario's "look_for" text is written for the model it names (the lessons': the tiny one).
Another model tokenizes, samples and stops otherwise, so its steps and sequences differ; the text
is then derived from the recorded trace: what that run did at its focus step, by name.

    look_for(run) -> str                    a demo run's text, always from its trace
    lesson_look_for(trace, scenario) -> str a lesson's own text on its own model, else from the trace
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from collections.abc import Sequence as SequenceOf
from typing import Any

from nanoengine.sequence import EventKind, FinishReason
from tracer.i18n import _, ngettext
from tracer.replay.colors import seq_letter
from tracer.teach.scenarios import Scenario, ScenarioRun


def who(seq_id: int) -> str:
    return _("seq {seq_id} ({letter})").format(seq_id=seq_id, letter=seq_letter(seq_id))


def block_list(blocks: list[int]) -> str:
    if len(blocks) > 3 and blocks == list(range(blocks[0], blocks[0] + len(blocks))):
        return _("blocks {first}-{last}").format(first=blocks[0], last=blocks[-1])
    return ngettext("block {ids}", "blocks {ids}", len(blocks)).format(ids=", ".join(map(str, blocks)))


# ---- one event, in words ---------------------------------------------------------------------
def preempted_text(e: Mapping[str, Any], step: int) -> str:
    d = e.get("detail") or {}
    needed = re.search(r"seq (\d+) needed", str(d.get("reason", "")))  # a trace before `by`
    by = d.get("by", int(needed.group(1)) if needed else None)
    needer = who(by) if isinstance(by, int) else _("a running request")
    return _(
        "Step {step}: {needer} needs a new KV block and none is free, so the newest running request, "
        "{victim}, is preempted: its blocks go back to the pool and it waits at the head of the queue, to be "
        "recomputed later (press n to see it return)."
    ).format(step=step, needer=needer, victim=who(e["seq_id"]))


def prefix_hit_text(e: Mapping[str, Any], step: int) -> str:
    d = e.get("detail") or {}
    return _(
        "Step {step}: {seq} is admitted with a prefix hit: its block table starts with {blocks}, already in "
        "the cache and now shared, so {saved} prompt tokens are not computed again; only the rest of its "
        "prompt is."
    ).format(step=step, seq=who(e["seq_id"]), blocks=block_list(d.get("blocks") or []), saved=d.get("tokens_saved"))


def prefill_chunk_text(e: Mapping[str, Any], step: int) -> str:
    d = e.get("detail") or {}
    return _(
        "Step {step}: {seq}'s {n}-token prompt is prefilled in chunks (this is chunk {chunk}, tokens {start} "
        "up to {end}) that fill the token budget, while the short requests keep decoding one token per step; "
        "its sampled token is discarded until the last chunk."
    ).format(
        step=step,
        seq=who(e["seq_id"]),
        n=d.get("num_tokens"),
        chunk=d.get("chunk"),
        start=d.get("start"),
        end=d.get("end"),
    )


def finished_text(e: Mapping[str, Any], step: int, after: Mapping[str, Any] | None) -> str:
    admitted = [x["seq_id"] for x in (after or {}).get("events", []) if x["kind"] == EventKind.ADMITTED]
    then = (
        _("in step {step} {seq} takes its place").format(step=after["step"], seq=who(admitted[0]))
        if after and admitted
        else _("in the next steps a waiting request takes its place")
    )
    return _(
        "Step {step}: {seq} finishes; {then}. In static batching its place would stay empty until the whole "
        "batch is done."
    ).format(step=step, seq=who(e["seq_id"]), then=then)


def beam_search_text(steps: SequenceOf[Mapping[str, Any]]) -> str | None:
    """A beam search's first copy-on-write, the fork that made the sharing and the first pruned
    beam, each by step and name; None when the run has no copy-on-write."""
    cow = first_event(steps, lambda e: e["kind"] == EventKind.COPY_ON_WRITE)
    fork = first_event(steps, lambda e: e["kind"] == EventKind.FORKED)
    pruned = first_event(steps, lambda e: (e.get("detail") or {}).get("reason") == FinishReason.PRUNED)
    if cow is None:
        return None
    step, e = cow
    d = e.get("detail") or {}
    texts = [
        _(
            "Step {step}: {seq} is about to write into block {source}, which other beams hold too, so it gets "
            "a copy, block {copy}, and the runner copies the K/V first; the block's last holder writes into "
            "block {source} itself."
        ).format(step=step, seq=who(e["seq_id"]), source=d.get("source"), copy=d.get("copy"))
    ]
    if fork is not None:
        step, e = fork
        d = e.get("detail") or {}
        texts.append(
            _(
                "The sharing began in step {step}: {child} was forked from {parent} and shares every one of "
                "its parent's {blocks}, each now held once more (no K/V is copied)."
            ).format(
                step=step,
                child=who(e["seq_id"]),
                parent=who(d.get("parent", -1)),
                blocks=block_list(d.get("blocks") or []),
            )
        )
    if pruned is not None:
        step, e = pruned
        width = next((r.get("beam_width") for r in steps_at(steps, step) if r["seq_id"] == e["seq_id"]), None)
        texts.append(
            _(
                "Step {step}: {seq} is pruned: none of its candidates ranked among the {width} best; the blocks "
                "only it held go back to the pool."
            ).format(step=step, seq=who(e["seq_id"]), width=width or "")
        )
    return " ".join(texts)


def first_event(
    steps: SequenceOf[Mapping[str, Any]], wanted: Callable[[Mapping[str, Any]], bool]
) -> tuple[int, Mapping[str, Any]] | None:
    """(step number, event) of the first event `wanted` picks."""
    return next(((s["step"], e) for s in steps for e in s.get("events", []) if wanted(e)), None)


def steps_at(steps: SequenceOf[Mapping[str, Any]], number: int) -> list[Mapping[str, Any]]:
    """The rows of step `number`."""
    return next((list(s.get("seqs", [])) for s in steps if s["step"] == number), [])


def event_phrase(e: Mapping[str, Any], seqs: Mapping[int, Mapping[str, Any]]) -> str:
    """One event of a step as a short phrase: 'seq 0 (A) finishes with reason length (3 tokens generated)'."""
    d, sid = e.get("detail") or {}, e["seq_id"]
    kind = e["kind"]
    if kind == EventKind.FINISHED:
        row = seqs.get(sid, {})
        generated = row.get("num_tokens_after", 0) - row.get("num_prompt_tokens", 0)
        return ngettext(
            "{seq} finishes with reason '{reason}' ({n} token generated)",
            "{seq} finishes with reason '{reason}' ({n} tokens generated)",
            generated,
        ).format(seq=who(sid), reason=d.get("reason"), n=generated)
    if kind == EventKind.ADMITTED:
        return _("{seq} is admitted").format(seq=who(sid))
    if kind == EventKind.PREEMPTED:
        by = d.get("by")
        if isinstance(by, int):
            return _("{seq} is preempted for {by}").format(seq=who(sid), by=who(by))
        return _("{seq} is preempted").format(seq=who(sid))
    if kind == EventKind.PREFIX_HIT:
        return _("{seq} gets {n} prompt tokens from the prefix cache").format(seq=who(sid), n=d.get("tokens_saved"))
    if kind == EventKind.PREFILL_CHUNK:
        return _("{seq} prefills tokens {start} up to {end} of {n}").format(
            seq=who(sid), start=d.get("start"), end=d.get("end"), n=d.get("num_tokens")
        )
    if kind == EventKind.PREFILL_DONE:
        chunks = d.get("chunks")
        return ngettext(
            "{seq}'s prompt is complete after {n} chunk",
            "{seq}'s prompt is complete after {n} chunks",
            chunks if isinstance(chunks, int) else 2,
        ).format(seq=who(sid), n=chunks)
    if kind == EventKind.FORKED:
        return _("{seq} is forked from {parent}, sharing its {blocks}").format(
            seq=who(sid), parent=who(int(d.get("parent", -1))), blocks=block_list(d.get("blocks") or [])
        )
    if kind == EventKind.COPY_ON_WRITE:
        return _("{seq} copies shared block {source} to block {copy} before it writes").format(
            seq=who(sid), source=d.get("source"), copy=d.get("copy")
        )
    if kind == EventKind.NOT_ADMITTED:
        return _("{seq} waits (needs {need} blocks, {free} free)").format(
            seq=who(sid), need=d.get("need"), free=d.get("free")
        )
    return f"{kind} {who(sid)}"


def step_text(step: Mapping[str, Any]) -> str:
    """What one step did, every event by name, and who is still running after it."""
    seqs = {r["seq_id"]: r for r in step.get("seqs", [])}
    phrases = [event_phrase(e, seqs) for e in step.get("events", [])]
    running = [who(sid) for sid, r in seqs.items() if r.get("status_after") == "RUNNING"]
    if not phrases:
        scheduled = [f"{who(sid)} {r['num_scheduled_tokens']}" for sid, r in seqs.items() if r["num_scheduled_tokens"]]
        phrases = [_("tokens computed: {seqs}").format(seqs=", ".join(scheduled) or _("none"))]
    still = (
        _("Still running after it: {seqs}.").format(seqs=", ".join(running))
        if running
        else _("Nothing is running after it.")
    )
    return _("Step {step}: {what}. {still}").format(step=step["step"], what=_("; ").join(phrases), still=still)


# ---- a whole run -----------------------------------------------------------------------------
def focus_steps(
    steps: SequenceOf[Mapping[str, Any]], focus_step: int | None
) -> tuple[Mapping[str, Any], Mapping[str, Any] | None] | None:
    """The focus step's line and the one after it (None at the end); None if it is not recorded."""
    index = {s["step"]: i for i, s in enumerate(steps)}
    if focus_step not in index:
        return None
    i = index[focus_step]
    return steps[i], steps[i + 1] if i + 1 < len(steps) else None


def look_for(run: ScenarioRun) -> str:
    """The "Look for" text of a demo run, naming the steps and sequences this trace shows (they
    differ between the tiny and the real model); the scenario's fixed text when none match."""
    from tracer.trace.trace_file import load_trace

    fixed = translated(run.scenario.look_for)
    if run.trace_path is None:
        return fixed
    steps = load_trace(run.trace_path, validate="none").steps
    found = focus_steps(steps, run.focus_step)
    kind = run.scenario.focus.get("event")
    if found is None or not kind:
        return fixed
    if kind in (EventKind.FORKED, EventKind.COPY_ON_WRITE):
        return beam_search_text(steps) or fixed
    focus, after = found
    e = next((x for x in focus["events"] if x["kind"] == kind), None)  # the first of its kind
    if e is None:
        return fixed
    texts = {
        EventKind.PREEMPTED: lambda: preempted_text(e, focus["step"]),
        EventKind.PREFIX_HIT: lambda: prefix_hit_text(e, focus["step"]),
        EventKind.PREFILL_CHUNK: lambda: prefill_chunk_text(e, focus["step"]),
        EventKind.FINISHED: lambda: finished_text(e, focus["step"], after),
    }
    return texts[kind]() if kind in texts else fixed


def translated(text: str) -> str:
    """A scenario's own look_for text in the reader's language (the catalog holds the lessons' and
    demos' texts; a teacher's own scenario keeps its words)."""
    return _(text) if text else text


def names_of(model: str) -> tuple[str, ...]:
    """What a trace header calls a scenario's model ('default' is recorded by its name)."""
    from nanoengine.loading.checkpoint import DEFAULT_MODEL

    return (model, DEFAULT_MODEL) if model in ("default", DEFAULT_MODEL) else (model,)


def lesson_look_for(trace: Any, scenario: Scenario) -> str:
    """The lesson's own text when the trace ran the model it was written for; otherwise what this
    trace's focus step did, said so."""
    model = str(trace.header.get("model") or "")
    if not scenario.look_for or model in names_of(scenario.model):
        return translated(scenario.look_for)
    found = focus_steps(trace.steps, trace.header.get("focus_step"))
    if found is None:
        return ""
    return _(
        "(on {model}; the lesson's own text is written for the {lesson_model} model, which tokenizes, samples "
        "and stops otherwise) {step}"
    ).format(model=model, lesson_model=scenario.model, step=step_text(found[0]))
